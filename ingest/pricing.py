"""Cost of a model round from the price table, when the event carries none."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from ingest.models import Backend, ModelPrice


@dataclass(frozen=True)
class Price:
    input_per_mtok: float
    output_per_mtok: float
    markup: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        raw = input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok
        return raw * self.markup / 1_000_000


FREE = Price(0.0, 0.0, 1.0)


class PriceBook:
    """Prices for the (backend, model) pairs one batch needs, read in one query each."""

    def __init__(self, pairs: set[tuple[str, str]]) -> None:
        backends = {b for b, _ in pairs}
        self._markup: dict[str, float] = {
            name: float(markup)
            for name, markup in Backend.objects.filter(name__in=backends).values_list("name", "markup")
        }
        self._prices: dict[tuple[str, str], tuple[Decimal, Decimal]] = {
            (backend, model): (pin, pout)
            for backend, model, pin, pout in ModelPrice.objects.filter(
                backend__name__in=backends
            ).values_list("backend__name", "model", "input_usd_per_mtok", "output_usd_per_mtok")
        }

    def price(self, backend: str, model: str) -> Price:
        found = self._prices.get((backend, model)) or self._prices.get((backend, ""))
        if found is None:
            return FREE
        return Price(float(found[0]), float(found[1]), self._markup.get(backend, 1.0))
