import pytest
from shopcart.cart import Cart
from shopcart.catalog import Catalog, Product, UnknownProduct
from shopcart.discounts import FixedOff
from shopcart.money import Money


@pytest.fixture
def cart():
    return Cart(Catalog([Product("TEA", "Green tea", Money(450)), Product("MUG", "Mug", Money(1200))]))


def test_subtotal_sums_lines(cart):
    cart.add("TEA", 2)
    cart.add("MUG")
    assert cart.subtotal() == Money(2100)


def test_adding_twice_accumulates(cart):
    cart.add("TEA")
    cart.add("TEA", 3)
    assert cart.quantity("TEA") == 4


def test_unknown_sku_cannot_be_added(cart):
    with pytest.raises(UnknownProduct):
        cart.add("NOPE")


def test_quantity_must_be_positive(cart):
    with pytest.raises(ValueError):
        cart.add("TEA", 0)


def test_fixed_discount_never_goes_below_zero(cart):
    cart.add("TEA")
    assert cart.total([FixedOff(Money(1000))]) == Money(0)
    assert cart.total([FixedOff(Money(50))]) == Money(400)
