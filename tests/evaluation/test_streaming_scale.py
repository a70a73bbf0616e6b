"""Streaming evaluation at 10M predictions: within its bound of the exact AUC, bounded memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from ctrctl.evaluation.synthetic import synthetic_arrays, synthetic_predictions
from ctrctl.metrics.streaming import CTRMetrics, Metrics


def stream(rows: int) -> tuple[Metrics, float]:
    """Binned metrics of ``rows`` synthetic predictions, and the peak traced MiB meanwhile."""
    tracemalloc.start()
    try:
        acc = CTRMetrics(exact_limit=0)
        for labels, scores in synthetic_predictions(rows, chunk_rows=1 << 18):
            acc.update(labels, scores)
        metrics = acc.compute()
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    return metrics, peak


@pytest.mark.slow
def test_10m_predictions_within_bound_and_constant_memory() -> None:
    rows = 10_000_000
    small, small_peak = stream(1_000_000)
    big, big_peak = stream(rows)
    print(f"peak traced memory: {small_peak:.0f} MiB at 1M rows, {big_peak:.0f} MiB at 10M")
    # memory does not grow with the rows: 10x the rows, about the same peak; holding the rows
    # alone (float32 score + int8 label) would take 48 MiB more, sorting them far more
    assert big_peak < small_peak * 1.2 + 8
    assert big_peak < 100
    labels, scores = synthetic_arrays(rows)
    exact = roc_auc_score(labels, scores.astype(np.float64))
    assert big.auc_mode == "binned"
    assert 0 < big.auc_bound < 1e-5
    assert abs(big.auc - exact) <= big.auc_bound
    assert big.rows == rows
