"""Exact metrics against scikit-learn on the same predictions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

from ctrctl.metrics.calibration import expected_calibration_error, reliability_table
from ctrctl.metrics.functional import (
    MetricError,
    average_precision,
    calibration_ratio,
    normalized_entropy,
    roc_auc,
)
from ctrctl.metrics.functional import log_loss as our_log_loss

TOL = 1e-6


def _sample(n: int, seed: int, decimals: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-(x - 2)))).astype(np.int8)
    scores = 1 / (1 + np.exp(-(0.7 * x - 2.2)))
    if decimals is not None:  # many exact ties
        scores = np.round(scores, decimals)
    return labels, scores


@pytest.mark.parametrize("decimals", [None, 3, 1])
@pytest.mark.parametrize("weighted", [False, True])
def test_metrics_match_sklearn(decimals: int | None, weighted: bool) -> None:
    labels, scores = _sample(20_000, seed=1, decimals=decimals)
    weights = np.random.default_rng(2).exponential(size=labels.size) if weighted else None
    assert roc_auc(labels, scores, weights) == pytest.approx(
        roc_auc_score(labels, scores, sample_weight=weights), abs=TOL
    )
    assert average_precision(labels, scores, weights) == pytest.approx(
        average_precision_score(labels, scores, sample_weight=weights), abs=TOL
    )
    assert our_log_loss(labels, scores, weights) == pytest.approx(
        log_loss(labels, scores, sample_weight=weights), abs=TOL
    )


def test_auc_counts_tied_pairs_as_half() -> None:
    # one positive and one negative, same score: the pair is worth 1/2
    assert roc_auc(np.array([0, 1]), np.array([0.3, 0.3])) == 0.5
    labels = np.array([0, 1, 0, 1, 1])
    scores = np.array([0.2, 0.2, 0.5, 0.5, 0.9])
    # pairs: (1@.2 vs 0@.2)=.5, (1@.2 vs 0@.5)=0, (1@.5 vs 0@.2)=1, (1@.5 vs 0@.5)=.5, 0.9 wins 2
    assert roc_auc(labels, scores) == pytest.approx((0.5 + 0 + 1 + 0.5 + 2) / 6)
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=TOL)


def test_logloss_clips_certain_mistakes_like_sklearn() -> None:
    labels = np.array([1, 0, 1, 0])
    scores = np.array([0.0, 1.0, 1.0, 0.0])
    assert np.isfinite(our_log_loss(labels, scores))
    assert our_log_loss(labels, scores) == pytest.approx(log_loss(labels, scores), rel=1e-9)


@pytest.mark.parametrize("label", [0, 1])
@pytest.mark.parametrize(
    "metric", [roc_auc, average_precision, normalized_entropy]
)
def test_one_class_is_a_clear_error(label: int, metric: object) -> None:
    labels = np.full(50, label)
    scores = np.linspace(0.01, 0.99, 50)
    with pytest.raises(MetricError, match="undefined") as info:
        metric(labels, scores)  # type: ignore[operator]
    assert ("positive" if label else "negative") in str(info.value)


def test_calibration_ratio_and_no_positives() -> None:
    labels = np.array([0, 1, 0, 0])
    scores = np.array([0.1, 0.6, 0.2, 0.1])
    assert calibration_ratio(labels, scores) == pytest.approx(1.0)
    assert calibration_ratio(labels, scores * 0.5) == pytest.approx(0.5)
    with pytest.raises(MetricError, match="no positive"):
        calibration_ratio(np.zeros(4), scores)


def test_normalized_entropy_is_logloss_over_base_rate_entropy() -> None:
    labels, scores = _sample(5_000, seed=3)
    p = labels.mean()
    entropy = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    assert normalized_entropy(labels, scores) == pytest.approx(
        log_loss(labels, scores) / entropy, abs=TOL
    )
    # predicting the base rate everywhere gives NE == 1
    assert normalized_entropy(labels, np.full(labels.size, p)) == pytest.approx(1.0, abs=TOL)


@pytest.mark.parametrize(
    ("labels", "scores", "message"),
    [
        ([0, 2], [0.1, 0.2], "0 or 1"),
        ([0, 1], [0.1, 1.5], r"\[0, 1\]"),
        ([0, 1], [0.1, np.nan], "NaN"),
        ([0, 1, 1], [0.1, 0.2], "3 labels but 2 scores"),
    ],
)
def test_invalid_inputs_are_clear_errors(labels: list, scores: list, message: str) -> None:
    with pytest.raises(MetricError, match=message):
        roc_auc(np.array(labels), np.array(scores))


def test_ece_equal_mass_bins_against_a_direct_computation() -> None:
    labels, scores = _sample(10_000, seed=4)
    table = reliability_table(labels, scores, n_bins=10)
    assert len(table) == 10
    order = np.argsort(scores, kind="stable")
    # 10,000 rows in 10 equal-mass bins: exactly 1,000 sorted rows each
    chunks = np.split(order, 10)
    expected = sum(abs(scores[c].mean() - labels[c].mean()) * c.size for c in chunks) / 10_000
    assert [b.weight for b in table] == [1000.0] * 10
    assert expected_calibration_error(table) == pytest.approx(expected, abs=TOL)
    # perfectly calibrated in expectation: scores drawn, labels ~ Bernoulli(score)
    rng = np.random.default_rng(5)
    p = rng.uniform(0.01, 0.3, size=200_000)
    y = (rng.random(p.size) < p).astype(np.int8)
    assert expected_calibration_error(reliability_table(y, p, n_bins=10)) < 0.005
    assert expected_calibration_error(reliability_table(y, p * 2, n_bins=10)) > 0.1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 1.0]),
                  st.floats(0.1, 5.0)),
        min_size=2,
        max_size=60,
    )
)
def test_property_auc_and_ap_match_sklearn(rows: list[tuple[int, float, float]]) -> None:
    labels = np.array([r[0] for r in rows])
    scores = np.array([r[1] for r in rows])
    weights = np.array([r[2] for r in rows])
    if labels.min() == labels.max():
        with pytest.raises(MetricError):
            roc_auc(labels, scores, weights)
        return
    assert roc_auc(labels, scores, weights) == pytest.approx(
        roc_auc_score(labels, scores, sample_weight=weights), abs=TOL
    )
    assert average_precision(labels, scores, weights) == pytest.approx(
        average_precision_score(labels, scores, sample_weight=weights), abs=TOL
    )


def test_agrees_with_torchmetrics_as_a_second_reference() -> None:
    import torch
    from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision

    labels, scores = _sample(20_000, seed=9, decimals=3)
    preds, target = torch.from_numpy(scores), torch.from_numpy(labels.astype(np.int64))
    assert roc_auc(labels, scores) == pytest.approx(
        float(BinaryAUROC(thresholds=None)(preds, target)), abs=TOL
    )
    assert average_precision(labels, scores) == pytest.approx(
        float(BinaryAveragePrecision(thresholds=None)(preds, target)), abs=TOL
    )
