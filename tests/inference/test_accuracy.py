"""INT8 and INT4 tables cost at most 0.001 and 0.005 AUC against the FP32 checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.testing.accuracy import criteo_sample_accuracy, synthetic_accuracy

ROOT = Path(__file__).resolve().parents[2]
BOUNDS = {"int8": 0.001, "int4": 0.005}


def _check(rows: list[dict[str, object]]) -> None:
    by_dtype = {r["dtype"]: r for r in rows}
    for dtype, bound in BOUNDS.items():
        loss = float(by_dtype[dtype]["auc_loss"])  # type: ignore[arg-type]
        assert loss <= bound, f"{dtype} loses {loss:.5f} AUC (bound {bound})"
    # The scores did change: the comparison is not of a model with itself.
    assert by_dtype["int4"]["logloss"] != by_dtype["fp32"]["logloss"]


@pytest.mark.slow
def test_quantized_auc_on_criteo_sample(criteo_8k: Path, tmp_path: Path) -> None:
    _check(criteo_sample_accuracy(criteo_8k, tmp_path, ROOT, tuple(BOUNDS)))


@pytest.mark.slow
def test_quantized_auc_on_synthetic_data(tmp_path: Path) -> None:
    rows = {"train": 10_000, "val": 500, "test": 4_000}
    _check(synthetic_accuracy(tmp_path, rows, tuple(BOUNDS)))
