"""The products a shop sells, by SKU."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shopcart.money import Money


class UnknownProduct(KeyError):
    """No product has this SKU."""


@dataclass(frozen=True)
class Product:
    sku: str
    name: str
    price: Money


class Catalog:
    def __init__(self, products: Iterable[Product] = ()):
        self._products: dict[str, Product] = {}
        for product in products:
            self.add(product)

    def add(self, product: Product) -> None:
        if product.sku in self._products:
            raise ValueError(f"duplicate SKU {product.sku!r}")
        self._products[product.sku] = product

    def get(self, sku: str) -> Product:
        try:
            return self._products[sku]
        except KeyError:
            raise UnknownProduct(sku) from None

    def __len__(self) -> int:
        return len(self._products)
