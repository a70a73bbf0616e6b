"""Metrics over more predictions than memory holds, and over several ranks.

:class:`MetricAccumulator` takes batches of (labels, scores, weights) and keeps, in constant
memory:

- exact running sums: rows, weight, positives, predicted clicks, logloss; so logloss, NE,
  the label rate and the calibration ratio are exact at any size;
- a :class:`ScoreHistogram`: per-class weighted counts (and score sums) in ``num_bins``
  (default 2**20) equal-width bins over the logit of the score, clamped to +-16 (probabilities
  1.1e-7 .. 1 - 1.1e-7). The binned AUC counts a positive/negative pair that shares a bin as 1/2,
  so its error is at most ``sum_b pos_b * neg_b / (2 * P * N)``, which every run computes and
  reports as ``auc_bound``; exact ties always share a bin, so they are counted as scikit-learn
  counts them.

It also holds the rows themselves while there are at most ``exact_limit`` of them, and then
computes AUC, PR-AUC and ECE exactly by sorting (``auc_mode="exact"``, bound 0). Past the limit
it drops them and the binned values are reported (``auc_mode="binned"``).

Across ranks (:meth:`MetricAccumulator.sync`) the sums and histograms are all-reduced, which
is an exact merge; the held rows are all-gathered only when every rank still holds its own.

Why not torchmetrics' binned AUROC: its state is a confusion matrix per threshold, updated by
comparing every prediction with every threshold (work and memory O(batch x thresholds)), which
rules out 2**20 thresholds; its exact mode holds every prediction. torchmetrics serves as a
second reference in the tests instead.

Example:
    >>> acc = MetricAccumulator()
    >>> for labels, scores in batches:          # any number of batches
    ...     acc.update(labels, scores)
    >>> acc.sync()                              # no-op on one process
    >>> m = acc.compute()
    >>> m.auc, m.auc_bound, m.auc_mode, m.logloss
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctrctl.evaluation.calibration import (
    DEFAULT_BINS,
    ReliabilityBin,
    expected_calibration_error,
    reliability_from_sorted,
    reliability_from_units,
)
from ctrctl.evaluation.metrics import (
    MetricError,
    ScoreGroups,
    auc_from_groups,
    auc_tie_bound,
    average_precision_from_groups,
    calibration_from,
    check_inputs,
    groups_from_sorted,
    logloss_sum,
    normalized_entropy_from,
    sort_rows,
)

logger = logging.getLogger(__name__)

DEFAULT_NUM_BINS = 1 << 20
#: Logits beyond +-16 (probability 1.1e-7 from 0 or 1) share the outermost bins.
LOGIT_RANGE = 16.0
DEFAULT_EXACT_LIMIT = 10_000_000
#: Rows buffered before they are binned: one bincount over 2**20 bins per million rows.
FLUSH_ROWS = 1 << 20


class ScoreHistogram:
    """Per-class weighted counts and score sums in equal-width bins of ``logit(score)``.

    Args:
        num_bins: number of bins over ``[-logit_range, logit_range]``.
        logit_range: half-width of the logit interval; scores beyond it go to the edge bins.
    """

    def __init__(self, num_bins: int = DEFAULT_NUM_BINS, logit_range: float = LOGIT_RANGE):
        if num_bins < 2:
            raise MetricError(f"a score histogram needs at least 2 bins, got {num_bins}")
        self.num_bins = num_bins
        self.logit_range = logit_range
        self.pos = np.zeros(num_bins)
        self.neg = np.zeros(num_bins)
        self.score_sum = np.zeros(num_bins)

    def bin_index(self, scores: np.ndarray) -> np.ndarray:
        """The bin of each score; non-decreasing in the score, which the AUC bound needs."""
        with np.errstate(divide="ignore"):
            logits = np.log(scores) - np.log1p(-scores)  # +-inf at 0 and 1, clipped below
        scaled = (np.clip(logits, -self.logit_range, self.logit_range) + self.logit_range) * (
            self.num_bins / (2.0 * self.logit_range)
        )
        return np.minimum(scaled.astype(np.int64), self.num_bins - 1)

    def add(self, labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None) -> None:
        """Add validated rows (labels int8, scores float64, weights float64 or None)."""
        index = self.bin_index(scores)
        w = np.ones(scores.size) if weights is None else weights
        wy = w * labels
        self.pos += np.bincount(index, weights=wy, minlength=self.num_bins)
        self.neg += np.bincount(index, weights=w - wy, minlength=self.num_bins)
        self.score_sum += np.bincount(index, weights=w * scores, minlength=self.num_bins)

    def merge(self, other: ScoreHistogram) -> None:
        """Add another histogram of the same shape (an exact merge)."""
        if (other.num_bins, other.logit_range) != (self.num_bins, self.logit_range):
            raise MetricError(
                f"cannot merge histograms of {other.num_bins} and {self.num_bins} bins"
            )
        self.pos += other.pos
        self.neg += other.neg
        self.score_sum += other.score_sum

    def groups(self) -> ScoreGroups:
        """The non-empty bins as score groups, ascending."""
        keep = (self.pos + self.neg) > 0
        return ScoreGroups(self.pos[keep], self.neg[keep], self.score_sum[keep])

    def edges(self) -> np.ndarray:
        """Bin edges in probability space, shape (num_bins + 1,)."""
        logits = np.linspace(-self.logit_range, self.logit_range, self.num_bins + 1)
        return 1.0 / (1.0 + np.exp(-logits))

    def reliability(self, n_bins: int) -> list[ReliabilityBin]:
        """Equal-mass reliability bins whose edges fall on histogram-bin edges."""
        edges = self.edges()
        weight = self.pos + self.neg
        keep = weight > 0
        return reliability_from_units(
            weight[keep], self.pos[keep], self.score_sum[keep], edges[:-1][keep],
            edges[1:][keep], n_bins,
        )

    def coarse(self, num_bins: int = 128) -> dict[str, list[float]]:
        """A coarser copy (``num_bins`` must divide ``self.num_bins``) for plots and JSON."""
        factor = self.num_bins // num_bins
        if factor * num_bins != self.num_bins:
            factor, num_bins = 1, self.num_bins
        logits = np.linspace(-self.logit_range, self.logit_range, num_bins + 1)
        return {
            "logit_edges": logits.tolist(),
            "positives": self.pos.reshape(num_bins, factor).sum(axis=1).tolist(),
            "negatives": self.neg.reshape(num_bins, factor).sum(axis=1).tolist(),
        }


@dataclass
class Metrics:
    """What an evaluation measured. A metric that is undefined for these rows (AUC on one
    class, say) is None, and ``undefined`` says why."""

    rows: int
    weight: float
    positives: float
    label_rate: float | None
    mean_score: float | None
    auc: float | None
    auc_bound: float | None
    auc_mode: str
    pr_auc: float | None
    logloss: float | None
    ne: float | None
    calibration: float | None
    ece: float | None
    reliability: list[ReliabilityBin] = field(default_factory=list)
    histogram: dict[str, list[float]] = field(default_factory=dict)
    undefined: dict[str, str] = field(default_factory=dict)

    def scalars(self) -> dict[str, Any]:
        """The flat key -> value view written to metrics.json."""
        return {
            "rows": self.rows,
            "weight": self.weight,
            "positives": self.positives,
            "label_rate": self.label_rate,
            "mean_score": self.mean_score,
            "auc": self.auc,
            "auc_bound": self.auc_bound,
            "auc_mode": self.auc_mode,
            "pr_auc": self.pr_auc,
            "logloss": self.logloss,
            "ne": self.ne,
            "calibration": self.calibration,
            "ece": self.ece,
        }


def _defined(name: str, undefined: dict[str, str], fn: Any, *args: Any) -> Any:
    """Run a metric; record why it is undefined instead of failing (strict=False path)."""
    try:
        return fn(*args)
    except MetricError as exc:
        undefined[name] = exc.message
        return None


class MetricAccumulator:
    """Streaming, mergeable evaluation state; see the module docstring.

    Args:
        num_bins: histogram bins (memory: 24 bytes per bin).
        exact_limit: rows held for exact AUC/PR-AUC/ECE; 0 means always binned.
        ece_bins: equal-mass bins for ECE and the reliability diagram.
        logit_range: histogram half-width in logit space.
    """

    def __init__(
        self,
        num_bins: int = DEFAULT_NUM_BINS,
        exact_limit: int = DEFAULT_EXACT_LIMIT,
        ece_bins: int = DEFAULT_BINS,
        logit_range: float = LOGIT_RANGE,
    ):
        self.histogram = ScoreHistogram(num_bins, logit_range)
        self.exact_limit = exact_limit
        self.ece_bins = ece_bins
        # rows, weight, positives, weighted score sum, logloss sum
        self.sums = np.zeros(5)
        self.has_weights = False
        self._held: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] | None = []
        self._held_rows = 0
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
        self._pending_rows = 0

    @property
    def rows(self) -> int:
        return int(self.sums[0])

    @property
    def holds_rows(self) -> bool:
        """Whether AUC/PR-AUC/ECE will be exact (the rows are still held)."""
        return self._held is not None

    def update(
        self, labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None
    ) -> None:
        """Add a batch of rows.

        Raises:
            MetricError: on invalid labels, scores or weights (see ``check_inputs``).
        """
        labels, scores, weights = check_inputs(labels, scores, weights)
        if weights is not None:
            self.has_weights = True
        w_sum = float(labels.size if weights is None else weights.sum())
        pos = float(labels.sum() if weights is None else np.dot(weights, labels))
        s_sum = float(scores.sum() if weights is None else np.dot(weights, scores))
        self.sums += (labels.size, w_sum, pos, s_sum, logloss_sum(labels, scores, weights))
        self._pending.append((labels, scores, weights))
        self._pending_rows += labels.size
        if self._held is not None:
            if self._held_rows + labels.size <= self.exact_limit:
                self._held.append((labels, scores, weights))
                self._held_rows += labels.size
            else:
                logger.info(
                    "more than %s rows: AUC, PR-AUC and ECE switch to the %s-bin histogram",
                    f"{self.exact_limit:,}", f"{self.histogram.num_bins:,}",
                )
                self._held, self._held_rows = None, 0
        if self._pending_rows >= FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        for labels, scores, weights in self._pending:
            self.histogram.add(labels, scores, weights)
        self._pending, self._pending_rows = [], 0

    def _held_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        assert self._held is not None
        if not self._held:
            return np.zeros(0, np.int8), np.zeros(0), None
        labels = np.concatenate([h[0] for h in self._held])
        scores = np.concatenate([h[1] for h in self._held])
        weights = None
        if self.has_weights:
            weights = np.concatenate(
                [np.ones(h[0].size) if h[2] is None else h[2] for h in self._held]
            )
        return labels, scores, weights

    def sync(self, group: Any = None) -> None:
        """Combine the state of every rank (exactly); a no-op without a process group.

        Every rank must call it, and every rank ends with the combined state.
        """
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return
        if dist.get_world_size(group) == 1:
            return
        self._flush()
        sums = torch.from_numpy(
            np.concatenate([self.sums, [float(self.has_weights)]])
        )
        dist.all_reduce(sums, group=group)
        for array in (self.histogram.pos, self.histogram.neg, self.histogram.score_sum):
            tensor = torch.from_numpy(array)  # shares memory: reduced in place
            dist.all_reduce(tensor, group=group)
        held = torch.tensor([1 if self._held is not None else 0], dtype=torch.int64)
        dist.all_reduce(held, op=dist.ReduceOp.MIN, group=group)
        total_rows = int(sums[0])
        self.sums = sums.numpy()[:5].copy()
        self.has_weights = bool(sums[5] > 0)
        if int(held) == 1 and total_rows <= self.exact_limit:
            mine = self._held_arrays()
            gathered: list[Any] = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, mine, group=group)
            self._held = [
                (lab, sc, w if w is not None or not self.has_weights else np.ones(lab.size))
                for lab, sc, w in gathered
            ]
            self._held_rows = total_rows
        else:
            self._held, self._held_rows = None, 0

    def compute(self, strict: bool = False) -> Metrics:
        """The metrics of everything added (and synced) so far.

        Args:
            strict: raise :class:`MetricError` for an undefined metric instead of None.
        """
        self._flush()
        rows, weight, positives, score_sum, loss_sum = (float(v) for v in self.sums)
        undefined: dict[str, str] = {}
        if self._held is not None:
            rows_sorted = sort_rows(*self._held_arrays())
            groups = groups_from_sorted(rows_sorted)
            mode = "exact"
        else:
            groups = self.histogram.groups()
            mode = "binned"
        label_rate = positives / weight if weight > 0 else None
        logloss = loss_sum / weight if weight > 0 else None
        if logloss is None:
            undefined["logloss"] = "there are no rows"
        auc = _defined("auc", undefined, auc_from_groups, groups)
        bound = 0.0 if mode == "exact" and auc is not None else (
            _defined("auc_bound", {}, auc_tie_bound, groups)
        )
        ne = (
            _defined("ne", undefined, normalized_entropy_from, logloss, label_rate)
            if logloss is not None and label_rate is not None
            else None
        )
        reliability: list[ReliabilityBin] = []
        if weight > 0:
            if mode == "exact":
                reliability = reliability_from_sorted(rows_sorted, self.ece_bins)
            else:
                reliability = self.histogram.reliability(self.ece_bins)
        metrics = Metrics(
            rows=int(rows),
            weight=weight,
            positives=positives,
            label_rate=label_rate,
            mean_score=score_sum / weight if weight > 0 else None,
            auc=auc,
            auc_bound=bound,
            auc_mode=mode,
            pr_auc=_defined("pr_auc", undefined, average_precision_from_groups, groups),
            logloss=logloss,
            ne=ne,
            calibration=_defined("calibration", undefined, calibration_from, score_sum, positives),
            ece=expected_calibration_error(reliability) if reliability else None,
            reliability=reliability,
            histogram=self.histogram.coarse(),
            undefined=undefined,
        )
        if strict and undefined:
            name, why = next(iter(undefined.items()))
            raise MetricError(why)
        if metrics.auc is not None and not math.isfinite(metrics.auc):  # pragma: no cover
            raise MetricError("AUC is not finite: a bug")
        return metrics
