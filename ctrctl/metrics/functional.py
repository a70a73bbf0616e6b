"""Exact metrics of a binary classifier's scores: AUC, PR-AUC, logloss, NE, calibration.

Every metric here works on *groups*: runs of rows that share one score, in ascending score
order, each with the (weighted) count of positives and negatives. Sorted rows give the exact
metrics (ties form one group, as scikit-learn treats them: a tied positive/negative pair counts
1/2); the bins of a score histogram give the streaming ones (``ctrctl.metrics.streaming``),
whose only uncertainty is the order of the pairs inside one bin.

Example:
    >>> import numpy as np
    >>> labels = np.array([0, 0, 1, 1]); scores = np.array([0.1, 0.4, 0.35, 0.8])
    >>> round(roc_auc(labels, scores), 4), round(log_loss(labels, scores), 4)
    (0.75, 0.4723)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ctrctl.errors import CtrctlError

#: scikit-learn clips probabilities to [eps, 1 - eps] of float64 before taking logs.
EPS = float(np.finfo(np.float64).eps)


class MetricError(CtrctlError):
    """A metric is undefined for the given rows (one class only, no rows, bad scores)."""


@dataclass(frozen=True)
class ScoreGroups:
    """Rows grouped by score, ascending: weighted positives and negatives per group.

    Attributes:
        pos: weighted count of label-1 rows per group, shape (G,).
        neg: weighted count of label-0 rows per group, shape (G,).
        score_sum: weighted sum of scores per group, shape (G,) (for calibration).
    """

    pos: np.ndarray
    neg: np.ndarray
    score_sum: np.ndarray

    @property
    def positives(self) -> float:
        return float(self.pos.sum())

    @property
    def negatives(self) -> float:
        return float(self.neg.sum())


def check_inputs(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate and convert rows: labels 0/1, scores in [0, 1] and finite, weights >= 0.

    Returns:
        ``(labels as int8, scores as float64, weights as float64 or None)``.

    Raises:
        MetricError: on shape mismatches, labels other than 0/1, scores outside [0, 1] or NaN,
            negative weights.
    """
    labels = np.asarray(labels).reshape(-1)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if labels.shape != scores.shape:
        raise MetricError(
            f"{labels.size} labels but {scores.size} scores", hint="pass one score per row"
        )
    if labels.size and not np.isin(labels, (0, 1)).all():
        bad = np.unique(labels[~np.isin(labels, (0, 1))])[:5]
        raise MetricError(f"labels must be 0 or 1, found {bad.tolist()}")
    if scores.size and not (np.isfinite(scores).all() and scores.min() >= 0 and scores.max() <= 1):
        raise MetricError(
            "scores must be probabilities in [0, 1] (no NaN)",
            hint="apply a sigmoid to logits before evaluating",
        )
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        if weights.shape != labels.shape:
            raise MetricError(f"{weights.size} weights for {labels.size} rows")
        if weights.size and (not np.isfinite(weights).all() or weights.min() < 0):
            raise MetricError("weights must be finite and >= 0")
    return labels.astype(np.int8, copy=False), scores, weights


@dataclass(frozen=True)
class SortedRows:
    """Validated rows sorted by score, ascending (weights are ones when none were given)."""

    labels: np.ndarray
    scores: np.ndarray
    weights: np.ndarray


def sort_rows(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> SortedRows:
    """Validate rows and sort them by score once (exact metrics and calibration share it)."""
    labels, scores, weights = check_inputs(labels, scores, weights)
    order = np.argsort(scores, kind="stable")
    w = np.ones(scores.size) if weights is None else weights[order]
    return SortedRows(labels[order].astype(np.float64), scores[order], w)


def groups_from_sorted(rows: SortedRows) -> ScoreGroups:
    """Merge the exact ties of sorted rows into score groups."""
    if rows.scores.size == 0:
        empty = np.zeros(0)
        return ScoreGroups(empty, empty, empty)
    starts = np.concatenate(([0], np.flatnonzero(np.diff(rows.scores)) + 1))
    wy = rows.weights * rows.labels
    pos = np.add.reduceat(wy, starts)
    neg = np.add.reduceat(rows.weights, starts) - pos
    score_sum = np.add.reduceat(rows.weights * rows.scores, starts)
    return ScoreGroups(pos, neg, score_sum)


def group_by_score(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> ScoreGroups:
    """Sort rows by score and merge exact ties into groups (the exact path).

    Args:
        labels: 0/1 per row.
        scores: probability per row.
        weights: optional non-negative weight per row.
    """
    return groups_from_sorted(sort_rows(labels, scores, weights))


def _require_both_classes(positives: float, negatives: float, metric: str) -> None:
    if positives <= 0 or negatives <= 0:
        only = "positive" if negatives <= 0 else "negative"
        if positives <= 0 and negatives <= 0:
            raise MetricError(f"{metric} is undefined: there are no rows (or all weights are 0)")
        raise MetricError(
            f"{metric} is undefined: every row is {only} "
            f"(positives={positives:g}, negatives={negatives:g})",
            hint="evaluate on a split that has both clicks and non-clicks",
        )


def auc_from_groups(groups: ScoreGroups) -> float:
    """ROC AUC: the probability that a random positive outscores a random negative.

    A positive and a negative in the same group count 1/2 (exact ties, or the unknown order
    inside one histogram bin).
    """
    positives, negatives = groups.positives, groups.negatives
    _require_both_classes(positives, negatives, "AUC")
    neg_below = np.cumsum(groups.neg) - groups.neg
    wins = float(np.dot(groups.pos, neg_below + 0.5 * groups.neg))
    return wins / (positives * negatives)


def auc_tie_bound(groups: ScoreGroups) -> float:
    """How far the AUC could move if the rows inside each group were ordered: the bound.

    Each positive/negative pair inside a group counted 1/2 but is really worth 0 or 1, so
    ``|AUC_true - AUC| <= sum_g pos_g * neg_g / (2 * P * N)``. Zero for exact (tied) groups.
    """
    positives, negatives = groups.positives, groups.negatives
    _require_both_classes(positives, negatives, "AUC")
    return float(np.dot(groups.pos, groups.neg)) / (2.0 * positives * negatives)


def average_precision_from_groups(groups: ScoreGroups) -> float:
    """PR-AUC as scikit-learn's average_precision_score: sum over thresholds (descending) of
    the recall gained times the precision there."""
    positives, negatives = groups.positives, groups.negatives
    _require_both_classes(positives, negatives, "PR-AUC")
    pos = groups.pos[::-1]
    neg = groups.neg[::-1]
    keep = (pos + neg) > 0  # empty histogram bins are not thresholds
    pos, neg = pos[keep], neg[keep]
    tp = np.cumsum(pos)
    predicted = tp + np.cumsum(neg)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    return float(np.dot(pos / positives, precision))


def roc_auc(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Exact ROC AUC, ties counted 1/2 (matches ``sklearn.metrics.roc_auc_score``).

    The one AUC of the project: evaluation, validation, and the best AUC of synthetic logs.
    Unweighted float32 scores take a faster path (one sort of 32-bit keys) with the same
    result.

    Raises:
        MetricError: when the rows hold only one class, or on invalid rows.
    """
    if weights is None:
        fast = _roc_auc_float32(labels, scores)
        if fast is not None:
            return fast
    return auc_from_groups(group_by_score(labels, scores, weights))


def _roc_auc_float32(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """Exact AUC of unweighted float32 probabilities by sorting their bit patterns; None
    when the rows do not suit it (other dtypes, NaN, a bad label or shape)."""
    prob = np.ascontiguousarray(scores)
    label = np.asarray(labels).reshape(-1)
    if prob.dtype != np.float32 or prob.ndim != 1 or label.shape != prob.shape or not prob.size:
        return None
    bits = prob.view(np.uint32)
    # Non-negative finite float32 values below 1.0 (0x3F800000) order as their bit patterns.
    if int(bits.max()) > 0x3F800000 or not ((label == 0) | (label == 1)).all():
        return None
    flag = label.astype(np.uint32)
    positives = int(flag.sum())
    negatives = label.size - positives
    _require_both_classes(positives, negatives, "AUC")
    # One uint32 key per row, value then label, so a value's negatives come before its
    # positives. The positive at sorted place i then has i - (positives before it) negatives
    # at or below its value.
    keys = np.sort((bits << np.uint32(1)) | flag)
    at_or_below = int(np.flatnonzero(keys & np.uint32(1)).sum()) - positives * (positives - 1) // 2
    # Tied negatives count one half: subtract half of (positives x negatives) per tied value.
    values = keys >> np.uint32(1)
    tied = np.flatnonzero(values[1:] == values[:-1])
    twice = 2 * at_or_below
    if len(tied):
        rows = np.union1d(tied, tied + 1)  # the rows of tied values, in sorted order
        _, group = np.unique(values[rows], return_inverse=True)
        pos = np.bincount(group, weights=keys[rows] & np.uint32(1)).astype(np.int64)
        twice -= int(np.dot(pos, np.bincount(group) - pos))
    return twice / (2 * positives * negatives)


def average_precision(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> float:
    """Exact PR-AUC (matches ``sklearn.metrics.average_precision_score``)."""
    return average_precision_from_groups(group_by_score(labels, scores, weights))


def logloss_sum(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Weighted sum of per-row log losses (scores clipped to [eps, 1 - eps] as scikit-learn)."""
    p = np.clip(scores.astype(np.float64, copy=False), EPS, 1.0 - EPS)
    per_row = -np.where(labels == 1, np.log(p), np.log1p(-p))
    return float(per_row.sum() if weights is None else np.dot(per_row, weights))


def log_loss(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Mean (weighted) binary cross-entropy, natural log (matches ``sklearn.metrics.log_loss``)."""
    labels, scores, weights = check_inputs(labels, scores, weights)
    total = float(labels.size if weights is None else weights.sum())
    if total <= 0:
        raise MetricError("logloss is undefined: there are no rows (or all weights are 0)")
    return logloss_sum(labels, scores, weights) / total


def binary_entropy(rate: float) -> float:
    """Entropy (nats) of a Bernoulli(rate): the logloss of always predicting the base rate."""
    if rate <= 0.0 or rate >= 1.0:
        return 0.0
    return -(rate * math.log(rate) + (1.0 - rate) * math.log1p(-rate))


def normalized_entropy_from(logloss_value: float, base_rate: float) -> float:
    """NE = logloss / entropy of the base rate: below 1 means better than the base rate."""
    entropy = binary_entropy(base_rate)
    if entropy == 0.0:
        only = "positive" if base_rate >= 1.0 else "negative"
        raise MetricError(
            f"normalized entropy is undefined: the label rate is {base_rate:g} "
            f"(every row is {only})",
            hint="evaluate on a split that has both clicks and non-clicks",
        )
    return logloss_value / entropy


def normalized_entropy(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> float:
    """Normalized entropy (He et al. 2014): logloss over the entropy of the label rate."""
    labels, scores, weights = check_inputs(labels, scores, weights)
    w = np.ones(labels.size) if weights is None else weights
    total = float(w.sum())
    if total <= 0:
        raise MetricError("normalized entropy is undefined: there are no rows")
    rate = float(np.dot(w, labels)) / total
    return normalized_entropy_from(logloss_sum(labels, scores, weights) / total, rate)


def calibration_from(score_sum: float, positives: float) -> float:
    """Calibration ratio: predicted clicks over observed clicks (1.0 is calibrated)."""
    if positives <= 0:
        raise MetricError(
            "calibration is undefined: there are no positive rows",
            hint="evaluate on a split that has clicks",
        )
    return score_sum / positives


def calibration_ratio(
    labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
) -> float:
    """Sum of predictions over sum of labels (weighted)."""
    labels, scores, weights = check_inputs(labels, scores, weights)
    w = np.ones(labels.size) if weights is None else weights
    return calibration_from(float(np.dot(w, scores)), float(np.dot(w, labels)))
