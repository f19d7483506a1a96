"""shopcart: money, a product catalog, carts and discounts."""

from shopcart.cart import Cart
from shopcart.catalog import Catalog, Product, UnknownProduct
from shopcart.discounts import FixedOff
from shopcart.money import Money

__all__ = ["Cart", "Catalog", "FixedOff", "Money", "Product", "UnknownProduct"]
