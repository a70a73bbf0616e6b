"""CTR metrics as torchmetrics ``Metric``s: streaming, mergeable across ranks, exact when small.

Every metric here is a :class:`torchmetrics.Metric`: ``update(labels, scores, weights=None)``
per batch, ``compute()`` at the end, ``reset()`` to start over; under ``torch.distributed``
``compute()`` first combines the states of every rank of ``process_group`` (torchmetrics'
sync, every state registered with its ``dist_reduce_fx``; gloo or NCCL), so each rank gets
the metric of the union of the rows. A user's own loop or Lightning module can use them as
any torchmetrics metric.

What the state holds, in constant memory:

- exact running sums (``dist_reduce_fx="sum"``): rows, weight, positives, predicted clicks,
  logloss; so logloss, NE, the label rate and the calibration ratio are exact at any size;
- a score histogram (``"sum"``): per-class weighted counts (and score sums) in ``num_bins``
  (default 2**20) equal-width bins over the logit of the score, clamped to +-16 (probabilities
  1.1e-7 .. 1 - 1.1e-7). The binned AUC counts a positive/negative pair that shares a bin as
  1/2, so its error is at most ``sum_b pos_b * neg_b / (2 * P * N)``, which every compute
  reports as ``auc_bound``; exact ties always share a bin, so they are counted as scikit-learn
  counts them;
- the rows themselves (``"cat"``) while there are at most ``exact_limit`` of them over all
  ranks: AUC, PR-AUC and ECE are then exact, by sorting (``auc_mode="exact"``, bound 0; the
  reference path of :mod:`ctrctl.metrics.functional`). Past the limit the rows are dropped and
  the binned values are reported (``auc_mode="binned"``).

Metrics: :class:`CTRMetrics` (all of them in one pass and one sync: what ``ctrctl eval`` and
training's validation use), :class:`StreamingAUC` (AUC and its bound),
:class:`ExpectedCalibrationError`, :class:`Calibration`, :class:`NormalizedEntropy`,
:class:`LogLoss`.

Why not torchmetrics' own binned AUROC: its state is a confusion matrix per threshold, updated
by comparing every prediction with every threshold (work and memory O(batch x thresholds)),
which rules out 2**20 thresholds; its exact mode holds every prediction. It serves as a
baseline in ``scripts/bench_eval.py`` and a second reference in the tests.

Example:
    >>> metric = CTRMetrics()
    >>> for labels, scores in batches:          # numpy arrays or tensors
    ...     metric.update(labels, scores)
    >>> m = metric.compute()                    # synced over ranks when distributed
    >>> m.auc, m.auc_bound, m.auc_mode, m.logloss
    >>> StreamingAUC(exact_limit=0)(labels, scores)["auc_bound"]
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat
from torchmetrics.utilities.distributed import gather_all_tensors

from ctrctl.metrics.calibration import (
    DEFAULT_BINS,
    ReliabilityBin,
    expected_calibration_error,
    reliability_from_sorted,
    reliability_from_units,
)
from ctrctl.metrics.functional import (
    MetricError,
    ScoreGroups,
    SortedRows,
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
    """Run a metric; record why it is undefined instead of failing."""
    try:
        return fn(*args)
    except MetricError as exc:
        undefined[name] = exc.message
        return None


def _numpy(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def _nan_if_none(value: float | None) -> torch.Tensor:
    return torch.tensor(float("nan") if value is None else value, dtype=torch.float64)


class ScoreMetric(Metric):
    """The state every CTR metric keeps (see the module docstring); subclasses compute.

    Args:
        num_bins: histogram bins (memory: 24 bytes per bin).
        exact_limit: rows held, over all ranks, for exact AUC/PR-AUC/ECE; 0: always binned.
        ece_bins: equal-mass bins for ECE and the reliability diagram.
        logit_range: histogram half-width in logit space.
        kwargs: torchmetrics' own (``process_group``, ``sync_on_compute``, ...).
    """

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False
    #: Whether the metric needs the score distribution (histogram and held rows) or only sums.
    needs_distribution = True

    sums: torch.Tensor
    weighted: torch.Tensor
    hist_pos: torch.Tensor
    hist_neg: torch.Tensor
    hist_score: torch.Tensor
    dropped: torch.Tensor
    held_labels: list[torch.Tensor]
    held_scores: list[torch.Tensor]
    held_weights: list[torch.Tensor]

    def __init__(self, num_bins: int = DEFAULT_NUM_BINS, exact_limit: int = DEFAULT_EXACT_LIMIT,
                 ece_bins: int = DEFAULT_BINS, logit_range: float = LOGIT_RANGE,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.exact_limit = exact_limit
        self.ece_bins = ece_bins
        self.binning = ScoreHistogram(num_bins if self.needs_distribution else 2, logit_range)
        f64 = torch.float64
        # rows, weight, positives, weighted score sum, logloss sum
        self.add_state("sums", torch.zeros(5, dtype=f64), dist_reduce_fx="sum")
        self.add_state("weighted", torch.zeros((), dtype=f64), dist_reduce_fx="sum")
        if not self.needs_distribution:
            return
        for name in ("hist_pos", "hist_neg", "hist_score"):
            self.add_state(name, torch.zeros(num_bins, dtype=f64), dist_reduce_fx="sum")
        # > 0 once some rank stopped holding rows (past exact_limit)
        self.add_state("dropped", torch.zeros((), dtype=f64), dist_reduce_fx="sum")
        self.add_state("held_labels", [], dist_reduce_fx="cat")
        self.add_state("held_scores", [], dist_reduce_fx="cat")
        self.add_state("held_weights", [], dist_reduce_fx="cat")

    @property
    def holds_rows(self) -> bool:
        """Whether AUC/PR-AUC/ECE will be exact (the rows are still held)."""
        return self.needs_distribution and float(self.dropped) == 0.0

    def update(self, labels: Any, scores: Any, weights: Any = None) -> None:  # type: ignore[override]
        """Add a batch of rows (numpy arrays or tensors): labels 0/1, probabilities, weights.

        Raises:
            MetricError: on invalid labels, scores or weights (see ``check_inputs``).
        """
        labels, scores, weights = check_inputs(
            _numpy(labels), _numpy(scores), None if weights is None else _numpy(weights))
        device = self.sums.device
        w_sum = float(labels.size if weights is None else weights.sum())
        pos = float(labels.sum() if weights is None else np.dot(weights, labels))
        s_sum = float(scores.sum() if weights is None else np.dot(weights, scores))
        self.sums += torch.tensor([labels.size, w_sum, pos, s_sum,
                                   logloss_sum(labels, scores, weights)],
                                  dtype=torch.float64, device=device)
        if weights is not None:
            self.weighted.fill_(1.0)
        if not self.needs_distribution or not labels.size:
            return
        index = torch.from_numpy(self.binning.bin_index(scores)).to(device)
        w = np.ones(scores.size) if weights is None else weights
        wy = w * labels
        self.hist_pos.index_add_(0, index, torch.from_numpy(wy).to(device))
        self.hist_neg.index_add_(0, index, torch.from_numpy(w - wy).to(device))
        self.hist_score.index_add_(0, index, torch.from_numpy(w * scores).to(device))
        if not self.holds_rows:
            return
        held = sum(int(t.numel()) for t in self.held_scores)
        if held + labels.size > self.exact_limit:
            logger.info("more than %s rows: AUC, PR-AUC and ECE switch to the %s-bin histogram",
                        f"{self.exact_limit:,}", f"{self.binning.num_bins:,}")
            self._drop_rows()
            return
        # Copies: the caller's arrays may be read-only (Arrow's) or reused for its next batch.
        self.held_labels.append(torch.tensor(labels, device=device))
        self.held_scores.append(torch.tensor(scores, device=device))
        if weights is not None and not self.held_weights:
            # the first weighted batch: the earlier ones weighed 1
            self.held_weights.extend(torch.ones_like(s) for s in self.held_scores[:-1])
        if weights is not None or self.held_weights:
            self.held_weights.append(torch.tensor(w, device=device))

    def _drop_rows(self) -> None:
        self.held_labels, self.held_scores, self.held_weights = [], [], []
        self.dropped += 1.0

    def _sync_dist(self, dist_sync_fn: Any = gather_all_tensors,
                   process_group: Any | None = None) -> None:
        """torchmetrics' sync, after agreeing whether the rows stay held on every rank.

        Rows are gathered only when every rank still holds its own and their total is within
        ``exact_limit``; otherwise every rank drops them first (the histograms carry on). Each
        rank then gives the same list states (weights on all or on none, an empty piece where
        it has no rows), so the gathers match.
        """
        if self.needs_distribution:
            group = process_group or self.process_group
            device = self.sums.device
            agree = torch.tensor([float(self.holds_rows), float(self.sums[0]),
                                  float(self.weighted)], dtype=torch.float64, device=device)
            dist.all_reduce(agree, group=group)
            world = dist.get_world_size(group)
            if int(agree[0]) < world or agree[1] > self.exact_limit:
                if self.holds_rows:
                    self._drop_rows()
            else:
                if agree[2] > 0 and not self.held_weights:
                    self.held_weights = [torch.ones_like(s) for s in self.held_scores]
                empty = {"held_labels": torch.int8, "held_scores": torch.float64,
                         "held_weights": torch.float64}
                for name, dtype in empty.items():
                    if name == "held_weights" and agree[2] == 0:
                        continue
                    if not getattr(self, name):
                        setattr(self, name, [torch.zeros(0, dtype=dtype, device=device)])
        super()._sync_dist(dist_sync_fn, process_group)

    # ---- what the subclasses compute from ----------------------------------------------
    def _totals(self) -> tuple[float, float, float, float, float]:
        rows, weight, positives, score_sum, loss_sum = (float(v) for v in self.sums)
        return rows, weight, positives, score_sum, loss_sum

    def _held_rows(self) -> SortedRows | None:
        """The held rows sorted by score (None once dropped)."""
        if not self.holds_rows:
            return None
        def cat(state: Any, dtype: Any) -> np.ndarray:
            if isinstance(state, list) and not state:
                return np.zeros(0, dtype)
            return dim_zero_cat(state).cpu().numpy()
        # weights are held on every rank once any rank was given some (see _sync_dist)
        weights = cat(self.held_weights, np.float64) if float(self.weighted) > 0 else None
        return sort_rows(cat(self.held_labels, np.int8), cat(self.held_scores, np.float64),
                         weights)

    def _histogram(self) -> ScoreHistogram:
        hist = ScoreHistogram(self.binning.num_bins, self.binning.logit_range)
        hist.pos = self.hist_pos.cpu().numpy()
        hist.neg = self.hist_neg.cpu().numpy()
        hist.score_sum = self.hist_score.cpu().numpy()
        return hist

    def _distribution(self) -> tuple[ScoreGroups, str, SortedRows | None, ScoreHistogram]:
        rows = self._held_rows()
        hist = self._histogram()
        if rows is not None:
            return groups_from_sorted(rows), "exact", rows, hist
        return hist.groups(), "binned", None, hist

    def _reliability(self, rows: SortedRows | None, hist: ScoreHistogram,
                     weight: float) -> list[ReliabilityBin]:
        if weight <= 0:
            return []
        if rows is not None:
            return reliability_from_sorted(rows, self.ece_bins)
        return hist.reliability(self.ece_bins)


class CTRMetrics(ScoreMetric):
    """Every metric of ``ctrctl eval`` in one pass and one sync: ``compute()`` gives
    :class:`Metrics` (a metric undefined for the rows is None, ``undefined`` says why).

    Example:
        >>> metric = CTRMetrics(exact_limit=10_000_000)
        >>> metric.update(labels, scores); metric.compute().auc
    """

    def compute(self) -> Metrics:  # type: ignore[override]
        rows, weight, positives, score_sum, loss_sum = self._totals()
        groups, mode, sorted_rows, hist = self._distribution()
        undefined: dict[str, str] = {}
        label_rate = positives / weight if weight > 0 else None
        logloss = loss_sum / weight if weight > 0 else None
        if logloss is None:
            undefined["logloss"] = "there are no rows"
        auc = _defined("auc", undefined, auc_from_groups, groups)
        bound = 0.0 if mode == "exact" and auc is not None else (
            _defined("auc_bound", {}, auc_tie_bound, groups))
        ne = (_defined("ne", undefined, normalized_entropy_from, logloss, label_rate)
              if logloss is not None and label_rate is not None else None)
        reliability = self._reliability(sorted_rows, hist, weight)
        metrics = Metrics(
            rows=int(rows), weight=weight, positives=positives, label_rate=label_rate,
            mean_score=score_sum / weight if weight > 0 else None,
            auc=auc, auc_bound=bound, auc_mode=mode,
            pr_auc=_defined("pr_auc", undefined, average_precision_from_groups, groups),
            logloss=logloss, ne=ne,
            calibration=_defined("calibration", undefined, calibration_from, score_sum,
                                 positives),
            ece=expected_calibration_error(reliability) if reliability else None,
            reliability=reliability, histogram=hist.coarse(), undefined=undefined,
        )
        if metrics.auc is not None and not math.isfinite(metrics.auc):  # pragma: no cover
            raise MetricError("AUC is not finite: a bug")
        return metrics


class StreamingAUC(ScoreMetric):
    """ROC AUC and its error bound: ``compute()`` gives ``{"auc", "auc_bound"}`` (float64
    tensors; NaN when the rows hold one class). Exact (bound 0) up to ``exact_limit`` rows.

    Example:
        >>> auc = StreamingAUC(exact_limit=0)          # always the 2**20-bin histogram
        >>> auc.update(labels, scores); auc.compute()["auc_bound"]
    """

    higher_is_better = True

    def compute(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        groups, mode, _, _ = self._distribution()
        undefined: dict[str, str] = {}
        auc = _defined("auc", undefined, auc_from_groups, groups)
        bound = None if auc is None else (0.0 if mode == "exact" else auc_tie_bound(groups))
        return {"auc": _nan_if_none(auc), "auc_bound": _nan_if_none(bound)}


class ExpectedCalibrationError(ScoreMetric):
    """ECE over ``ece_bins`` equal-mass bins (exact up to ``exact_limit`` rows, else with bin
    edges on the histogram's); NaN without rows."""

    higher_is_better = False

    def compute(self) -> torch.Tensor:  # type: ignore[override]
        _, _, rows, hist = self._distribution()
        reliability = self._reliability(rows, hist, self._totals()[1])
        return _nan_if_none(expected_calibration_error(reliability) if reliability else None)


class Calibration(ScoreMetric):
    """Calibration ratio: predicted clicks over observed clicks (1.0 is calibrated); exact at
    any size, NaN without positives."""

    needs_distribution = False

    def compute(self) -> torch.Tensor:  # type: ignore[override]
        _, _, positives, score_sum, _ = self._totals()
        return _nan_if_none(_defined("calibration", {}, calibration_from, score_sum, positives))


class NormalizedEntropy(ScoreMetric):
    """Normalized entropy (logloss over the entropy of the label rate); exact at any size, NaN
    when the rows hold one class."""

    needs_distribution = False
    higher_is_better = False

    def compute(self) -> torch.Tensor:  # type: ignore[override]
        _, weight, positives, _, loss_sum = self._totals()
        if weight <= 0:
            return _nan_if_none(None)
        return _nan_if_none(_defined("ne", {}, normalized_entropy_from, loss_sum / weight,
                                     positives / weight))


class LogLoss(ScoreMetric):
    """Mean (weighted) binary cross-entropy in nats, scores clipped as scikit-learn clips
    them; exact at any size, NaN without rows."""

    needs_distribution = False
    higher_is_better = False

    def compute(self) -> torch.Tensor:  # type: ignore[override]
        _, weight, _, _, loss_sum = self._totals()
        return _nan_if_none(loss_sum / weight if weight > 0 else None)
