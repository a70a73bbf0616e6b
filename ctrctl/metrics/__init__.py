"""Metric math for binary click models, below training and evaluation.

:mod:`ctrctl.metrics.functional` holds the exact metrics on numpy rows (AUC, PR-AUC, logloss,
NE, calibration) and their score-group forms, shared by training's validation and by
``ctrctl eval``.

Example:
    >>> from ctrctl.metrics import log_loss, roc_auc
    >>> roc_auc(np.array([0, 1, 1]), np.array([0.2, 0.7, 0.1]))
    0.5
"""

from ctrctl.metrics.functional import (
    EPS,
    MetricError,
    ScoreGroups,
    SortedRows,
    auc_from_groups,
    auc_tie_bound,
    average_precision,
    average_precision_from_groups,
    binary_entropy,
    calibration_from,
    calibration_ratio,
    check_inputs,
    group_by_score,
    groups_from_sorted,
    log_loss,
    logloss_sum,
    normalized_entropy,
    normalized_entropy_from,
    roc_auc,
    sort_rows,
)

__all__ = [
    "EPS",
    "MetricError",
    "ScoreGroups",
    "SortedRows",
    "auc_from_groups",
    "auc_tie_bound",
    "average_precision",
    "average_precision_from_groups",
    "binary_entropy",
    "calibration_from",
    "calibration_ratio",
    "check_inputs",
    "group_by_score",
    "groups_from_sorted",
    "log_loss",
    "logloss_sum",
    "normalized_entropy",
    "normalized_entropy_from",
    "roc_auc",
    "sort_rows",
]
