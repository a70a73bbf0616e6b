"""Gates: thresholds an evaluation must pass, written as ``auc>=0.70`` or ``calibration=1+-0.05``.

Forms: ``METRIC>=X``, ``METRIC<=X``, ``METRIC>X``, ``METRIC<X`` and ``METRIC=X+-TOL`` (``±``
also accepted). Gates are parsed before anything is evaluated, so a malformed gate or an
unknown metric name fails fast; a failed gate raises :class:`~ctrctl.errors.GateError`
(exit code 3) naming the gate and the margin it missed by.

Example:
    >>> gates = parse_gates(["auc>=0.7", "calibration=1.0+-0.05"])
    >>> results = check_gates(gates, {"auc": 0.72, "calibration": 1.08})
    >>> [r.passed for r in results]
    [True, False]
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ctrctl.errors import ConfigError, GateError

#: Metric names a gate may use: every numeric key of metrics.json.
GATE_METRICS: tuple[str, ...] = (
    "auc", "auc_bound", "pr_auc", "logloss", "ne", "calibration", "ece", "rows",
    "label_rate", "mean_score", "auc_lift", "logloss_lift",
)

_GATE = re.compile(
    r"^\s*(?P<metric>[A-Za-z_][A-Za-z0-9_.]*)\s*(?P<op>>=|<=|>|<|==|=)\s*"
    r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
    r"(?:\s*(?:\+-|\+/-|±)\s*(?P<tol>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))?\s*$"
)


@dataclass(frozen=True)
class Gate:
    """One threshold on one metric."""

    metric: str
    op: str
    value: float
    tolerance: float = 0.0

    def __str__(self) -> str:
        if self.op == "=":
            return f"{self.metric}={self.value:g}+-{self.tolerance:g}"
        return f"{self.metric}{self.op}{self.value:g}"

    def check(self, actual: float) -> GateResult:
        """Compare ``actual`` with the threshold; ``margin`` < 0 means it failed by that much."""
        if self.op == ">=":
            margin = actual - self.value
            passed = margin >= 0
        elif self.op == ">":
            margin = actual - self.value
            passed = margin > 0
        elif self.op == "<=":
            margin = self.value - actual
            passed = margin >= 0
        elif self.op == "<":
            margin = self.value - actual
            passed = margin > 0
        else:
            margin = self.tolerance - abs(actual - self.value)
            passed = margin >= 0
        return GateResult(gate=self, actual=actual, passed=passed, margin=margin)


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    actual: float | None
    passed: bool
    margin: float | None

    def describe(self) -> str:
        if self.actual is None:
            return f"{self.gate}: {self.gate.metric} is undefined for this evaluation"
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"{self.gate}: {verdict}, {self.gate.metric}={self.actual:.6g} "
            f"({'missed' if not self.passed else 'margin'} by {abs(self.margin or 0):.4g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"gate": str(self.gate), "metric": self.gate.metric, "actual": self.actual,
                "passed": self.passed, "margin": self.margin}


def parse_gate(text: str, metrics: Iterable[str] = GATE_METRICS) -> Gate:
    """Parse one gate.

    Raises:
        ConfigError: when the text is malformed or names an unknown metric.
    """
    match = _GATE.match(text)
    if match is None:
        raise ConfigError(
            f"malformed gate {text!r}",
            where="--gate",
            hint="write METRIC>=X, METRIC<=X, METRIC>X, METRIC<X or METRIC=X+-TOL, "
            "e.g. auc>=0.7 or calibration=1.0+-0.05",
        )
    metric, op = match["metric"], match["op"]
    known = tuple(metrics)
    if metric not in known:
        raise ConfigError(
            f"unknown metric {metric!r} in gate {text!r}",
            where="--gate",
            hint=f"gates can use: {', '.join(known)}",
        )
    if op in ("=", "==") and match["tol"] is None:
        raise ConfigError(
            f"gate {text!r} compares for equality without a tolerance",
            where="--gate",
            hint=f"write {metric}={match['value']}+-TOL, e.g. +-0.05",
        )
    if op not in ("=", "==") and match["tol"] is not None:
        raise ConfigError(f"gate {text!r}: a tolerance goes only with '='", where="--gate")
    return Gate(metric, "=" if op == "==" else op, float(match["value"]),
                float(match["tol"] or 0.0))


def parse_gates(texts: Iterable[str], metrics: Iterable[str] = GATE_METRICS) -> tuple[Gate, ...]:
    """Parse every gate (fails on the first bad one)."""
    known = tuple(metrics)
    return tuple(parse_gate(text, known) for text in texts)


#: For a bare number in a config (``gates: {auc: 0.70}``): which way is better.
HIGHER_IS_BETTER = frozenset({"auc", "pr_auc", "auc_lift", "logloss_lift", "rows"})
LOWER_IS_BETTER = frozenset({"logloss", "ne", "ece", "auc_bound"})


def gates_from_mapping(gates: Mapping[str, float | str]) -> tuple[Gate, ...]:
    """Gates from a pipeline config's ``metric: bound`` mapping.

    A number means "at least" for metrics where higher is better (auc: 0.7 -> auc>=0.7) and
    "at most" where lower is better (logloss: 0.5 -> logloss<=0.5); a string is the rest of a
    gate (``calibration: "=1.0+-0.05"``, ``auc: ">0.7"``).

    Raises:
        ConfigError: for a bare number on a metric with no better direction (calibration).
    """
    parsed = []
    for metric, bound in gates.items():
        if isinstance(bound, str):
            parsed.append(parse_gate(f"{metric}{bound.strip()}"))
        elif metric in HIGHER_IS_BETTER:
            parsed.append(parse_gate(f"{metric}>={bound!r}"))
        elif metric in LOWER_IS_BETTER:
            parsed.append(parse_gate(f"{metric}<={bound!r}"))
        else:
            parse_gate(f"{metric}>=0")  # an unknown name fails with the list of known ones
            raise ConfigError(
                f"gate {metric}: {bound!r} does not say which way it must hold",
                where="eval.gates",
                hint=f'write it as a string, e.g. {metric}: "=1.0+-0.05" or {metric}: ">=0.9"',
            )
    return tuple(parsed)


def check_gates(gates: Iterable[Gate], metrics: Mapping[str, Any]) -> list[GateResult]:
    """Check each gate against ``metrics``; an undefined (None/NaN) metric fails its gate."""
    results = []
    for gate in gates:
        actual = metrics.get(gate.metric)
        if actual is None or not isinstance(actual, (int, float)) or math.isnan(actual):
            results.append(GateResult(gate, None, False, None))
        else:
            results.append(gate.check(float(actual)))
    return results


def raise_for_failures(results: Iterable[GateResult]) -> None:
    """Raise GateError listing every failed gate, or return when all passed."""
    failed = [r for r in results if not r.passed]
    if failed:
        raise GateError(
            f"{len(failed)} gate(s) failed: " + "; ".join(r.describe() for r in failed),
            hint="metrics.json and gates.json in the output folder hold every value",
        )
