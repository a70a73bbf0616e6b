"""The same metrics per segment: per value of one feature (site, device type, ...).

State per segment is vectorised: one row of a (segments x bins) histogram per class plus
per-segment running sums, updated with ``np.bincount`` over ``segment * bins + bin``. The
first ``max_segments`` values seen get their own row; later new values share the
``__other__`` row (logged), so memory is bounded whatever the feature's cardinality. While the
rows are few enough (``exact_limit``) they are also held, and each segment's AUC, PR-AUC
are then exact; otherwise they come from the segment's histogram with its bound, as for the
whole split. Across ranks the value lists are gathered first so that every rank uses the same
segment rows, then the states are summed.

Example:
    >>> seg = SegmentAccumulator("site_id")
    >>> seg.update(site_ids, labels, scores)
    >>> seg.sync()
    >>> rows = seg.compute()     # [{'segment': 'a3f', 'rows': 1200, 'auc': 0.71, ...}, ...]
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ctrctl.metrics.functional import (
    EPS,
    MetricError,
    ScoreGroups,
    auc_from_groups,
    auc_tie_bound,
    average_precision_from_groups,
    calibration_from,
    check_inputs,
    group_by_score,
    normalized_entropy_from,
)
from ctrctl.metrics.streaming import LOGIT_RANGE, ScoreHistogram

logger = logging.getLogger(__name__)

OTHER = "__other__"
DEFAULT_MAX_SEGMENTS = 1000
DEFAULT_SEGMENT_BINS = 1024


def _maybe(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except MetricError:
        return None


def summarize(groups: ScoreGroups, sums: np.ndarray, mode: str) -> dict[str, Any]:
    """Metrics of one segment from its score groups and its
    (rows, weight, positives, score sum, logloss sum); undefined metrics are None."""
    rows, weight, positives, score_sum, loss = (float(v) for v in sums)
    logloss = loss / weight if weight > 0 else None
    rate = positives / weight if weight > 0 else None
    auc = _maybe(auc_from_groups, groups)
    return {
        "rows": int(rows),
        "weight": weight,
        "positives": positives,
        "label_rate": rate,
        "mean_score": score_sum / weight if weight > 0 else None,
        "auc": auc,
        "auc_bound": (0.0 if mode == "exact" else _maybe(auc_tie_bound, groups))
        if auc is not None else None,
        "pr_auc": _maybe(average_precision_from_groups, groups),
        "logloss": logloss,
        "ne": _maybe(normalized_entropy_from, logloss, rate) if logloss is not None else None,
        "calibration": _maybe(calibration_from, score_sum, positives),
    }


class SegmentAccumulator:
    """Streaming per-segment metrics for one feature.

    Args:
        feature: the feature's name (for messages and outputs).
        max_segments: distinct values with a segment of their own; the rest go to ``__other__``.
        num_bins: histogram bins per segment.
        exact_limit: rows held for exact per-segment AUC; 0 means always binned.
    """

    def __init__(
        self,
        feature: str,
        max_segments: int = DEFAULT_MAX_SEGMENTS,
        num_bins: int = DEFAULT_SEGMENT_BINS,
        exact_limit: int = 10_000_000,
    ):
        self.feature = feature
        self.max_segments = max_segments
        self.binner = ScoreHistogram(num_bins, LOGIT_RANGE)
        self.num_bins = num_bins
        self.exact_limit = exact_limit
        self.values: list[Any] = []
        self._index: dict[Any, int] = {}
        slots = max_segments + 1  # the last row is __other__
        self.hist = np.zeros((3, slots * num_bins))  # positives, negatives, score sums
        self.sums = np.zeros((5, slots))  # rows, weight, positives, score sum, logloss
        self._held: list[tuple[np.ndarray, ...]] | None = []
        self._held_rows = 0
        self._warned = False

    def _slots(self, values: np.ndarray) -> np.ndarray:
        uniques, inverse = np.unique(values, return_inverse=True)
        slot_of = np.empty(uniques.size, np.int64)
        for i, value in enumerate(uniques.tolist()):
            slot = self._index.get(value)
            if slot is None:
                if len(self.values) < self.max_segments:
                    slot = len(self.values)
                    self._index[value] = slot
                    self.values.append(value)
                else:
                    slot = self.max_segments
                    if not self._warned:
                        self._warned = True
                        logger.warning(
                            "%s has more than %d values: the rest are counted as %s",
                            self.feature, self.max_segments, OTHER,
                        )
            slot_of[i] = slot
        return slot_of[inverse.reshape(-1)]

    def update(
        self,
        values: np.ndarray,
        labels: np.ndarray,
        scores: np.ndarray,
        weights: np.ndarray | None = None,
    ) -> None:
        """Add rows with their segment values (one value per row)."""
        values = np.asarray(values)
        if values.ndim != 1 or values.dtype == object and values.size and isinstance(
            values[0], (list, np.ndarray)
        ):
            raise MetricError(
                f"cannot segment by {self.feature!r}: it holds several values per row",
                hint="segment by a one-hot feature",
            )
        labels, scores, weights = check_inputs(labels, scores, weights)
        if values.size != labels.size:
            raise MetricError(f"{values.size} segment values for {labels.size} rows")
        slots = self._slots(values)
        w = np.ones(labels.size) if weights is None else weights
        cell = slots * self.num_bins + self.binner.bin_index(scores)
        size = self.hist.shape[1]
        wy = w * labels
        self.hist[0] += np.bincount(cell, weights=wy, minlength=size)
        self.hist[1] += np.bincount(cell, weights=w - wy, minlength=size)
        self.hist[2] += np.bincount(cell, weights=w * scores, minlength=size)
        p = np.clip(scores, EPS, 1.0 - EPS)
        per_row_loss = -np.where(labels == 1, np.log(p), np.log1p(-p)) * w
        slots_n = self.sums.shape[1]
        for k, column in enumerate((np.ones(labels.size), w, wy, w * scores, per_row_loss)):
            self.sums[k] += np.bincount(slots, weights=column, minlength=slots_n)
        if self._held is not None:
            if self._held_rows + labels.size <= self.exact_limit:
                self._held.append((slots, labels, scores, w))
                self._held_rows += labels.size
            else:
                self._held = None

    def sync(self, group: Any = None) -> None:
        """Combine every rank's segments; every rank must call it."""
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return
        world = dist.get_world_size(group)
        if world == 1:
            return
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, self.values, group=group)
        union: list[Any] = []
        seen: dict[Any, int] = {}
        for values in everyone:
            for value in values:
                if value not in seen:
                    seen[value] = len(union) if len(union) < self.max_segments else -1
                    if seen[value] >= 0:
                        union.append(value)
        remap = np.array(
            [seen[v] if seen[v] >= 0 else self.max_segments for v in self.values]
            + [self.max_segments], dtype=np.int64,
        )
        slots = self.max_segments + 1
        old_slots = np.concatenate([np.arange(len(self.values)), [self.max_segments]])
        hist = self.hist.reshape(3, slots, self.num_bins)
        # two values can land on one row (both into __other__): add, do not assign
        new_hist = np.zeros_like(hist)
        new_sums = np.zeros_like(self.sums)
        for k in range(3):
            np.add.at(new_hist[k], remap, hist[k, old_slots])
        for k in range(self.sums.shape[0]):
            np.add.at(new_sums[k], remap, self.sums[k, old_slots])
        for array in (new_hist, new_sums):
            dist.all_reduce(torch.from_numpy(array), group=group)
        self.hist = new_hist.reshape(3, -1)
        self.sums = new_sums
        slot_map = np.full(slots, self.max_segments, np.int64)
        slot_map[old_slots] = remap
        held = torch.tensor([1 if self._held is not None else 0])
        dist.all_reduce(held, op=dist.ReduceOp.MIN, group=group)
        if int(held) == 1 and self.sums[0].sum() <= self.exact_limit:
            mine = [(slot_map[s], y, p, w) for s, y, p, w in (self._held or [])]
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, mine, group=group)
            self._held = [chunk for chunks in gathered for chunk in chunks]
        else:
            self._held = None
        self.values, self._index = union, {v: i for i, v in enumerate(union)}

    def compute(self) -> list[dict[str, Any]]:
        """One dict per segment (``__other__`` last if used), largest segments first."""
        slots = self.max_segments + 1
        hist = self.hist.reshape(3, slots, self.num_bins)
        exact = self._held is not None
        if exact and self._held:
            seg = np.concatenate([h[0] for h in self._held])
            order = np.argsort(seg, kind="stable")
            labels = np.concatenate([h[1] for h in self._held])[order]
            scores = np.concatenate([h[2] for h in self._held])[order]
            weights = np.concatenate([h[3] for h in self._held])[order]
            bounds = np.searchsorted(seg[order], np.arange(slots + 1))
        names = [*self.values, OTHER]
        slot_ids = [*range(len(self.values)), self.max_segments]
        out = []
        for name, slot in zip(names, slot_ids, strict=True):
            if self.sums[0, slot] == 0:
                continue
            if exact:
                part = slice(bounds[slot], bounds[slot + 1])
                groups = group_by_score(labels[part], scores[part], weights[part])
            else:
                keep = (hist[0, slot] + hist[1, slot]) > 0
                groups = ScoreGroups(hist[0, slot][keep], hist[1, slot][keep],
                                     hist[2, slot][keep])
            row = {"feature": self.feature, "segment": name}
            row.update(summarize(groups, self.sums[:, slot], "exact" if exact else "binned"))
            row["auc_mode"] = "exact" if exact else "binned"
            out.append(row)
        out.sort(key=lambda r: (r["segment"] == OTHER, -r["weight"]))
        return out
