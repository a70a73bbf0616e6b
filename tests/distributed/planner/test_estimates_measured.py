"""The estimate means something: on gloo at world size 2, measured step times of several plans
rank like their estimates, and after calibration each estimate is within 30% of its
measurement (scripts/check_plan_estimates.py is the same check with a report)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location(
        "check_plan_estimates", ROOT / "scripts" / "check_plan_estimates.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.distributed
def test_estimates_rank_and_match_measurements() -> None:
    from ctrctl.distributed.planner.calibration import calibrate

    check = _script().check
    result = check(calibrate(None, quick=True), quick=True)
    rows = {r["plan"]: r for r in result["rows"]}
    assert len(rows) == 7
    assert result["spearman"] >= 0.8, rows
    assert result["max_abs_error"] <= 0.30, rows
