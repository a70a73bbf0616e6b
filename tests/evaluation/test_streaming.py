"""Streaming (histogram) metrics against the exact ones, and the exact merge across ranks."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

from ctrctl.metrics.streaming import CTRMetrics, ScoreHistogram


def synthetic(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """CTR-like predictions: ~4% clicks, informative but imperfect float32 scores."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n).astype(np.float32)
    labels = (rng.random(n, dtype=np.float32) < 1 / (1 + np.exp(-(1.2 * x - 3.6)))).astype(np.int8)
    scores = (1 / (1 + np.exp(-(x - 3.4)))).astype(np.float32)
    return labels, scores


def feed(acc: CTRMetrics, labels: np.ndarray, scores: np.ndarray,
         weights: np.ndarray | None = None, batch: int = 65_536) -> CTRMetrics:
    for start in range(0, labels.size, batch):
        stop = start + batch
        acc.update(labels[start:stop], scores[start:stop],
                   None if weights is None else weights[start:stop])
    return acc


def test_binned_matches_exact_within_its_bound_on_1m() -> None:
    labels, scores = synthetic(1_000_000)
    exact = feed(CTRMetrics(), labels, scores).compute()
    binned = feed(CTRMetrics(exact_limit=0), labels, scores).compute()
    assert exact.auc_mode == "exact" and exact.auc_bound == 0.0
    assert binned.auc_mode == "binned"
    reference = roc_auc_score(labels, scores.astype(np.float64))
    assert exact.auc == pytest.approx(reference, abs=1e-6)
    assert binned.auc_bound is not None and 0 < binned.auc_bound < 1e-4
    assert abs(binned.auc - reference) <= binned.auc_bound
    # the sums are exact in both modes
    assert binned.logloss == pytest.approx(log_loss(labels, scores.astype(np.float64)), abs=1e-6)
    assert binned.calibration == pytest.approx(exact.calibration, rel=1e-9)
    assert binned.pr_auc == pytest.approx(
        average_precision_score(labels, scores.astype(np.float64)), abs=1e-3
    )
    assert binned.ece == pytest.approx(exact.ece, abs=1e-3)


@pytest.mark.parametrize("num_bins", [64, 1024, 1 << 14])
def test_bound_holds_when_bins_are_coarse(num_bins: int) -> None:
    labels, scores = synthetic(200_000, seed=1)
    reference = roc_auc_score(labels, scores.astype(np.float64))
    m = feed(CTRMetrics(num_bins=num_bins, exact_limit=0), labels, scores).compute()
    error = abs(m.auc - reference)
    assert error <= m.auc_bound
    if num_bins == 64:
        assert error > 1e-4  # coarse bins really do lose information: the test can fail


def test_ties_in_one_bin_are_exact() -> None:
    # every score is one of 5 values: ties only, so the histogram loses nothing
    rng = np.random.default_rng(2)
    scores = rng.choice([0.01, 0.02, 0.05, 0.2, 0.6], size=50_000)
    labels = (rng.random(scores.size) < scores).astype(np.int8)
    m = feed(CTRMetrics(exact_limit=0), labels, scores).compute()
    assert m.auc == pytest.approx(roc_auc_score(labels, scores), abs=1e-6)
    assert m.pr_auc == pytest.approx(average_precision_score(labels, scores), abs=1e-6)


def test_weighted_streaming_matches_sklearn() -> None:
    labels, scores = synthetic(100_000, seed=3)
    weights = np.random.default_rng(4).exponential(size=labels.size)
    s64 = scores.astype(np.float64)
    for limit in (10**7, 0):
        m = feed(CTRMetrics(exact_limit=limit), labels, scores, weights).compute()
        reference = roc_auc_score(labels, s64, sample_weight=weights)
        assert abs(m.auc - reference) <= max(m.auc_bound, 1e-6)
        assert m.logloss == pytest.approx(log_loss(labels, s64, sample_weight=weights), abs=1e-6)


def test_switches_to_binned_past_the_limit_and_reports_it() -> None:
    labels, scores = synthetic(30_000, seed=5)
    acc = feed(CTRMetrics(exact_limit=20_000), labels, scores, batch=5_000)
    assert not acc.holds_rows
    m = acc.compute()
    assert m.auc_mode == "binned" and m.rows == 30_000


def test_one_class_gives_none_with_a_reason_not_nan() -> None:
    m = feed(CTRMetrics(), np.zeros(100, np.int8), np.full(100, 0.1)).compute()
    assert m.auc is None and m.ne is None and m.calibration is None
    assert "every row is negative" in m.undefined["auc"]
    assert m.logloss == pytest.approx(-np.log(0.9))


def test_histogram_bins_are_monotone_in_the_score() -> None:
    hist = ScoreHistogram(1 << 20)
    scores = np.sort(np.concatenate([[0.0, 1.0, 1e-12, 1 - 1e-12],
                                     np.random.default_rng(6).random(100_000)]))
    index = hist.bin_index(scores)
    assert (np.diff(index) >= 0).all()
    assert index[0] == 0 and index[-1] == hist.num_bins - 1
