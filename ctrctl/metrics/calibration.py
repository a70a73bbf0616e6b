"""Calibration beyond the ratio: equal-mass reliability bins and expected calibration error.

Rows are sorted by score and cut into ``n_bins`` bins of equal (weighted) mass; each bin
compares its mean prediction with its observed click rate. ECE is the mass-weighted mean of
``|mean prediction - click rate|`` over the bins. Equal-mass bins (rather than equal-width)
matter for CTR: most scores sit below a few percent, and equal-width bins would put nearly
every row in the first bin.

A row goes to bin ``floor(K * (mass before it + half its own mass) / total mass)``; the exact
path applies this to sorted rows, the streaming path to the bins of its score histogram (so its
bin edges can only fall on histogram-bin edges).

Example:
    >>> import numpy as np
    >>> table = reliability_table(np.array([0, 1, 0, 1]), np.array([.1, .2, .6, .9]), n_bins=2)
    >>> [round(b.mean_score, 2) for b in table], round(expected_calibration_error(table), 3)
    ([0.15, 0.75], 0.3)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ctrctl.metrics.functional import MetricError, SortedRows, sort_rows

DEFAULT_BINS = 20


@dataclass
class ReliabilityBin:
    """One equal-mass bin of the reliability diagram (not frozen: torchmetrics copies the
    results of ``compute()`` field by field)."""

    weight: float
    positives: float
    mean_score: float
    click_rate: float
    score_min: float
    score_max: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reliability_from_units(
    weight: np.ndarray,
    positives: np.ndarray,
    score_sum: np.ndarray,
    score_low: np.ndarray,
    score_high: np.ndarray,
    n_bins: int = DEFAULT_BINS,
) -> list[ReliabilityBin]:
    """Equal-mass bins over units (rows or histogram bins) in ascending score order.

    Args:
        weight: mass of each unit, shape (U,).
        positives: weighted positives of each unit, shape (U,).
        score_sum: weighted score sum of each unit, shape (U,).
        score_low: lowest score in each unit (for the bin's range), shape (U,).
        score_high: highest score in each unit, shape (U,).
        n_bins: number of bins wanted; fewer come back when there are fewer units.
    """
    if n_bins < 1:
        raise MetricError(f"the number of calibration bins must be >= 1, got {n_bins}")
    keep = weight > 0
    weight, positives, score_sum = weight[keep], positives[keep], score_sum[keep]
    score_low, score_high = score_low[keep], score_high[keep]
    total = float(weight.sum())
    if total <= 0:
        raise MetricError("calibration error is undefined: there are no rows")
    middle = np.cumsum(weight) - 0.5 * weight
    which = np.minimum((middle * n_bins / total).astype(np.int64), n_bins - 1)
    # units are in score order, so each bin is a contiguous run of them
    starts = np.flatnonzero(np.diff(which, prepend=-1))
    mass = np.add.reduceat(weight, starts)
    pos = np.add.reduceat(positives, starts)
    scores = np.add.reduceat(score_sum, starts)
    low = np.minimum.reduceat(score_low, starts)
    high = np.maximum.reduceat(score_high, starts)
    return [
        ReliabilityBin(
            weight=float(m), positives=float(p), mean_score=float(sc / m),
            click_rate=float(p / m), score_min=float(lo), score_max=float(hi),
        )
        for m, p, sc, lo, hi in zip(mass, pos, scores, low, high, strict=True)
    ]


def reliability_table(
    labels: np.ndarray,
    scores: np.ndarray,
    weights: np.ndarray | None = None,
    n_bins: int = DEFAULT_BINS,
) -> list[ReliabilityBin]:
    """Exact equal-mass reliability bins of in-memory rows.

    Args:
        labels: 0/1 per row.
        scores: probability per row.
        weights: optional weight per row.
        n_bins: number of equal-mass bins.
    """
    return reliability_from_sorted(sort_rows(labels, scores, weights), n_bins)


def reliability_from_sorted(rows: SortedRows, n_bins: int = DEFAULT_BINS) -> list[ReliabilityBin]:
    """Equal-mass reliability bins of rows already sorted by score."""
    w, s = rows.weights, rows.scores
    return reliability_from_units(w, w * rows.labels, w * s, s, s, n_bins)


def expected_calibration_error(table: list[ReliabilityBin]) -> float:
    """ECE: mass-weighted mean of ``|mean prediction - click rate|`` over the bins."""
    total = sum(b.weight for b in table)
    if total <= 0:
        raise MetricError("calibration error is undefined: there are no rows")
    return sum(b.weight * abs(b.mean_score - b.click_rate) for b in table) / total
