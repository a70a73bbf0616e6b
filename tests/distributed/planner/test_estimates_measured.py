"""The estimate means something: on gloo at world size 2, after calibration, plans that the
model tells clearly apart (estimates more than 3x apart: replicating every table against
sharding them) measure in the same order, and every estimate is within a factor of 3 of its
measurement.

Why 3 and not the target's 30%: on the shared 2-core machine these run on, one plan measures
up to 1.9x apart from one round to the next, and a calibration taken a minute earlier may
have seen other load. Over the last 6 runs of the check script the largest error was 86%
(the median error of each plan 13% or less, row-wise at 1,024 samples 31%; the README lists
them), and one run in four of this test missed a factor of 2. The 30% target and the full
ranking need a quiet machine: ``scripts/check_plan_estimates.py`` checks them (exit code 1
when missed) and prints the full table."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: Estimate over measurement stays within [1/TOLERANCE, TOLERANCE] (see the docstring).
TOLERANCE = 3.0


@cache
def _measured() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location(
        "check_plan_estimates", ROOT / "scripts" / "check_plan_estimates.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from ctrctl.planning.calibration import calibrate

    return module.check(calibrate(None, quick=True), quick=True)


@pytest.mark.slow
@pytest.mark.distributed
def test_estimates_order_distinct_plans_and_are_the_right_size() -> None:
    rows = {r["plan"]: r for r in _measured()["rows"]}
    assert len(rows) == 7
    for name, row in rows.items():
        ratio = row["estimate_ms"] / row["measured_ms"]
        assert 1 / TOLERANCE <= ratio <= TOLERANCE, (name, rows)
    for a in rows.values():
        for b in rows.values():
            if a["estimate_ms"] > TOLERANCE * b["estimate_ms"]:
                assert a["measured_ms"] > b["measured_ms"], (a, b)
