import pytest
from shopcart.catalog import Catalog, Product, UnknownProduct
from shopcart.money import Money


def test_get_returns_the_product():
    tea = Product("TEA", "Green tea", Money(450))
    assert Catalog([tea]).get("TEA") is tea


def test_unknown_sku_raises():
    with pytest.raises(UnknownProduct):
        Catalog().get("NOPE")


def test_duplicate_sku_is_refused():
    with pytest.raises(ValueError):
        Catalog([Product("TEA", "Green tea", Money(450)), Product("TEA", "Black tea", Money(400))])
