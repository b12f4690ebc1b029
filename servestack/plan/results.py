"""What `servestack plan` answers: each mode's option (configuration, cost lines, or why it is ruled out) and
the plan that recommends the cheapest option meeting the profile."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from servestack.plan.profile import MODES, Measurement, Mode, Prices, Traffic
from servestack.sizing import decimal_text

# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CostLine:
    """quantity x the unit price of `price_key` = usd; the test checks each against the price file."""

    what: str
    quantity: Fraction
    price_key: str
    unit_usd: Fraction

    @property
    def usd(self) -> Fraction:
        return self.quantity * self.unit_usd


@dataclass
class Option:
    mode: Mode
    feasible: bool
    reason: str = ""
    configuration: str = ""
    lines: list[CostLine] = field(default_factory=list)
    deployment: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    estimate: bool = False
    # Figures behind the configuration (instances, concurrency, seconds per job...), exact.
    details: dict[str, Fraction | int] = field(default_factory=dict)
    # The same mode on the other CPU architecture (AWS Graviton beside x86_64), priced or what would price it.
    beside: list[str] = field(default_factory=list)

    @property
    def monthly_usd(self) -> Fraction | None:
        return sum((line.usd for line in self.lines), Fraction(0)) if self.feasible else None

    @classmethod
    def ruled_out(cls, mode: Mode, reason: str) -> Option:
        return cls(mode, False, reason)


@dataclass
class Plan:
    traffic: Traffic
    prices: Prices
    measurements: list[Measurement]
    options: list[Option]
    model: str
    version: str | None

    @property
    def recommended(self) -> Option | None:
        feasible = [o for o in self.options if o.feasible]
        if not feasible:
            return None
        return min(feasible, key=lambda o: (o.monthly_usd, MODES.index(o.mode)))

    def fragment(self) -> dict[str, Any] | None:
        chosen = self.recommended
        if chosen is None or chosen.deployment is None:
            return None
        block: dict[str, Any] = {"mode": chosen.mode, "model": self.model}
        if self.version:
            block["version"] = self.version
        block.update(chosen.deployment)
        return {"deployments": {f"{self.model}-{chosen.mode}": block}}

    def to_dict(self) -> dict[str, Any]:
        chosen = self.recommended
        return {
            "prices": {
                "file": self.prices.path.name,
                "read_on": self.prices.read_on,
                "region": self.prices.region,
                "not_rechecked": self.prices.not_rechecked,
            },
            "traffic": self.traffic.describe(),
            "measurements": [m.label() for m in self.measurements],
            "options": [
                {
                    "mode": o.mode,
                    "feasible": o.feasible,
                    "reason": o.reason,
                    "configuration": o.configuration,
                    "estimate": o.estimate,
                    "monthly_usd": None if o.monthly_usd is None else decimal_text(o.monthly_usd, 2, grouping=False),
                    "lines": [
                        {
                            "what": line.what,
                            "quantity": str(line.quantity),
                            "price": line.price_key,
                            "usd": decimal_text(line.usd, 4, grouping=False),
                        }
                        for line in o.lines
                    ],
                    "notes": o.notes,
                    "beside": o.beside,
                }
                for o in self.options
            ],
            "recommended": chosen.mode if chosen else None,
            "fragment": self.fragment(),
        }
