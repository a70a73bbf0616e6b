"""The torchmetrics Metrics against scikit-learn, the exact functions and across ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.metrics import (
    Calibration,
    CTRMetrics,
    ExpectedCalibrationError,
    LogLoss,
    MetricError,
    NormalizedEntropy,
    StreamingAUC,
    calibration_ratio,
    expected_calibration_error,
    normalized_entropy,
    reliability_table,
    roc_auc,
)
from ctrctl.testing.metrics import ROWS, metric_rows, metric_values, synced_metrics_body


def _close(actual: float, expected: float, what: str = "") -> None:
    torch.testing.assert_close(torch.tensor(actual, dtype=torch.float64),
                               torch.tensor(expected, dtype=torch.float64), msg=what)


@pytest.mark.parametrize("weighted", [False, True])
def test_exact_path_matches_sklearn_and_the_functions(weighted: bool) -> None:
    labels, scores, weights = metric_rows()
    w = weights if weighted else None
    got = metric_values(labels, scores, w, exact_limit=ROWS)
    s64 = scores.astype(np.float64)
    assert got["ctr.exact"] == 1.0 and got["auc_bound"] == 0.0
    _close(got["auc"], roc_auc_score(labels, s64, sample_weight=w), "auc vs sklearn")
    _close(got["ctr.auc"], roc_auc(labels, scores, w), "auc vs exact function")
    _close(got["ctr.pr_auc"], average_precision_score(labels, s64, sample_weight=w), "pr_auc")
    _close(got["logloss"], log_loss(labels, s64, sample_weight=w), "logloss")
    _close(got["ctr.logloss"], got["logloss"])
    _close(got["ne"], normalized_entropy(labels, scores, w), "ne")
    _close(got["calibration"], calibration_ratio(labels, scores, w), "calibration")
    _close(got["ece"], expected_calibration_error(reliability_table(labels, scores, w)), "ece")
    _close(got["ctr.ece"], got["ece"])


def test_binned_path_stays_within_its_bound() -> None:
    labels, scores, weights = metric_rows()
    got = metric_values(labels, scores, weights, exact_limit=0)
    reference = roc_auc_score(labels, scores.astype(np.float64), sample_weight=weights)
    assert got["ctr.exact"] == 0.0 and got["auc_bound"] > 0.0
    assert abs(got["auc"] - reference) <= got["auc_bound"]
    _close(got["ctr.auc_bound"], got["auc_bound"])
    # the sums stay exact whatever the mode
    _close(got["logloss"], log_loss(labels, scores.astype(np.float64), sample_weight=weights))


def test_metrics_accept_tensors_and_work_as_torchmetrics() -> None:
    labels, scores, _ = metric_rows()
    auc = StreamingAUC()
    batch_value = auc(torch.from_numpy(labels[:5000]), torch.from_numpy(scores[:5000]))
    _close(float(batch_value["auc"]), roc_auc(labels[:5000], scores[:5000]), "forward")
    auc.update(torch.from_numpy(labels[5000:]), torch.from_numpy(scores[5000:]))
    _close(float(auc.compute()["auc"]), roc_auc(labels, scores), "accumulated")
    auc.reset()
    auc.update(labels[:10], scores[:10])
    assert float(auc.compute()["auc"]) == pytest.approx(roc_auc(labels[:10], scores[:10]))


def test_undefined_metrics_are_nan_and_bad_rows_are_errors() -> None:
    for metric in (StreamingAUC(), NormalizedEntropy(), Calibration()):
        metric.update(np.zeros(10, np.int8), np.full(10, 0.2))
        value = metric.compute()
        value = value["auc"] if isinstance(value, dict) else value
        assert torch.isnan(value)
    assert torch.isnan(LogLoss().compute()) and torch.isnan(ExpectedCalibrationError().compute())
    with pytest.raises(MetricError, match="probabilities"):
        CTRMetrics().update(np.array([0, 1]), np.array([0.5, 1.5]))


def test_float32_fast_path_agrees_with_the_grouped_path() -> None:
    labels, scores, _ = metric_rows(seed=11)
    fast = roc_auc(labels, scores)
    grouped = roc_auc(labels, scores.astype(np.float64))
    _close(fast, grouped)
    _close(fast, roc_auc_score(labels, scores.astype(np.float64)))
    with pytest.raises(MetricError, match="every row is positive"):
        roc_auc(np.ones(4, np.int8), np.array([0.1, 0.2, 0.3, 0.4], np.float32))


@pytest.mark.distributed
@pytest.mark.parametrize("world_size, weighted_ranks", [
    (2, (0,)),
    # the third rank has no rows: its empty states must still join every gather
    pytest.param(3, (1,), marks=pytest.mark.slow),
])
def test_synced_metrics_equal_one_process_on_the_union(world_size: int,
                                                       weighted_ranks: tuple[int, ...]) -> None:
    per_rank = run_multiprocess(synced_metrics_body, world_size, args=(weighted_ranks,))
    labels, scores, weights = metric_rows()
    # the union: weights where a rank gave them, ones where it gave none
    cuts = [0, ROWS // 3, ROWS, ROWS][: world_size + 1]
    cuts[-1] = ROWS
    union_w = np.ones(ROWS)
    for r in weighted_ranks:
        union_w[cuts[r]:cuts[r + 1]] = weights[cuts[r]:cuts[r + 1]]
    for mode, limit in (("exact", ROWS), ("binned", 0)):
        single = metric_values(labels, scores, union_w, limit)
        for rank, result in enumerate(per_rank):
            assert set(result[mode]) == set(single)
            for key, value in single.items():
                _close(result[mode][key], value, f"rank {rank} {mode} {key}")


def test_held_rows_are_copies_of_the_callers_arrays() -> None:
    # A caller that fills one buffer per batch (or hands over Arrow's read-only arrays)
    # must not change the rows already held for the exact AUC.
    labels, scores, _ = metric_rows()
    half = labels.size // 2
    auc = StreamingAUC()
    buffer_labels, buffer_scores = labels[:half].copy(), scores[:half].astype(np.float64)
    auc.update(buffer_labels, buffer_scores)
    buffer_labels[:] = labels[half:2 * half]
    buffer_scores[:] = scores[half:2 * half]
    auc.update(buffer_labels, buffer_scores)
    read_only = scores[2 * half:].astype(np.float64)
    read_only.flags.writeable = False
    auc.update(labels[2 * half:], read_only)
    _close(float(auc.compute()["auc"]), roc_auc_score(labels, scores.astype(np.float64)), "auc")
