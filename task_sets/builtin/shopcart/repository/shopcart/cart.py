"""A shopping cart: quantities per SKU of one catalog."""

from __future__ import annotations

from collections.abc import Sequence

from shopcart.catalog import Catalog, Product
from shopcart.discounts import FixedOff
from shopcart.money import ZERO, Money


class Cart:
    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self._quantities: dict[str, int] = {}

    def add(self, sku: str, quantity: int = 1) -> None:
        if quantity < 1:
            raise ValueError(f"quantity must be at least 1, not {quantity}")
        self.catalog.get(sku)  # raises UnknownProduct
        self._quantities[sku] = self._quantities.get(sku, 0) + quantity

    def quantity(self, sku: str) -> int:
        return self._quantities.get(sku, 0)

    def lines(self) -> list[tuple[Product, int]]:
        return [(self.catalog.get(sku), quantity) for sku, quantity in self._quantities.items()]

    def subtotal(self) -> Money:
        total = ZERO
        for product, quantity in self.lines():
            total = total + product.price * quantity
        return total

    def total(self, discounts: Sequence[FixedOff] = ()) -> Money:
        """The subtotal less every discount, each computed on the subtotal."""
        subtotal = self.subtotal()
        off = ZERO
        for discount in discounts:
            off = off + discount.amount(subtotal)
        return max(subtotal - off, ZERO)
