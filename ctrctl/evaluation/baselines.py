"""Simple baselines scored on the same rows as the model, to measure its lift.

- ``base_rate``: every row gets the training split's click rate (AUC 0.5 by construction).
- ``feature_ctr:<F>``: every row gets the click rate of its value of feature ``F`` on the
  training split, smoothed toward the base rate: ``(clicks + a * rate) / (impressions + a)``
  with ``a = smoothing`` pseudo-impressions, so rare values do not get 0 or 1. Values unseen in
  training get the base rate.

Each baseline streams one feature column at a time (bounded memory) through its own
:class:`~ctrctl.metrics.streaming.CTRMetrics`.

Example:
    >>> results = feature_ctr_baselines("dataset", "test", features=["C1", "C2"])
    >>> best = max(results, key=lambda r: r["auc"] or 0)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ctrctl.data.manifest import DatasetManifest
from ctrctl.evaluation.sources import rank_range, read_columns, split_files
from ctrctl.metrics.functional import EPS
from ctrctl.metrics.streaming import CTRMetrics

logger = logging.getLogger(__name__)

DEFAULT_SMOOTHING = 20.0
#: Baseline scores take one value per feature value: a coarser histogram keeps ties exact.
BASELINE_BINS = 1 << 16


def base_rate_baseline(train_rate: float, weight: float, positives: float) -> dict[str, Any]:
    """Metrics of predicting ``train_rate`` for every row, from the rows' weight and clicks."""
    p = min(max(train_rate, EPS), 1.0 - EPS)
    negatives = weight - positives
    logloss = -(positives * np.log(p) + negatives * np.log1p(-p)) / weight if weight else None
    return {
        "baseline": "base_rate",
        "feature": None,
        "auc": 0.5 if positives > 0 and negatives > 0 else None,
        "logloss": float(logloss) if logloss is not None else None,
        "calibration": train_rate * weight / positives if positives > 0 else None,
    }


def feature_ctr_table(
    dataset: Path, manifest: DatasetManifest, feature: str, smoothing: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Sorted feature values and their smoothed training CTRs, and the training base rate."""
    files = [str(f) for f in split_files(dataset, manifest, "train")]
    label = manifest.label
    counts = (
        pl.scan_parquet(files)
        .select(pl.col(feature), pl.col(label).cast(pl.Float64))
        .group_by(feature)
        .agg(pl.len().alias("n"), pl.col(label).sum().alias("clicks"))
        .sort(feature)
        .collect()
    )
    n = counts["n"].to_numpy().astype(np.float64)
    clicks = counts["clicks"].to_numpy()
    rate = float(clicks.sum() / n.sum()) if n.sum() else 0.0
    ctr = (clicks + smoothing * rate) / (n + smoothing)
    return counts[feature].to_numpy(), ctr, rate


def feature_ctr_baselines(
    dataset: str | Path,
    split: str,
    features: Sequence[str] | None = None,
    smoothing: float = DEFAULT_SMOOTHING,
    rank: int = 0,
    world_size: int = 1,
    exact_limit: int = 10_000_000,
    group: Any = None,
) -> list[dict[str, Any]]:
    """Score ``split`` with each feature's smoothed training CTR; one result per feature.

    Args:
        dataset: a dataset folder with a ``train`` split.
        split: the split to score.
        features: one-hot sparse features (default: all of them).
        smoothing: pseudo-impressions at the base rate added to every value.
        rank, world_size: this rank's share of the rows; results are synced across ranks.
        exact_limit: rows held for exact AUC (as :class:`CTRMetrics`).
        group: the process group to sync over (default: the default group, if any).
    """
    dataset = Path(dataset)
    manifest = DatasetManifest.load(dataset)
    names = features if features is not None else [
        f.name for f in manifest.sparse if not f.multi_hot
    ]
    files = split_files(dataset, manifest, split)
    start, stop = rank_range(manifest.split(split).rows, rank, world_size)
    results = []
    for feature in names:
        values, ctr, rate = feature_ctr_table(dataset, manifest, feature, smoothing)
        acc = CTRMetrics(num_bins=BASELINE_BINS, exact_limit=exact_limit, process_group=group)
        for batch in read_columns(files, [manifest.label, feature], start, stop):
            x = batch[feature]
            where = np.clip(np.searchsorted(values, x), 0, max(values.size - 1, 0))
            found = values.size > 0
            hit = (values[where] == x) if found else np.zeros(x.size, bool)
            scores = np.where(hit, ctr[where] if found else rate, rate)
            acc.update(batch[manifest.label], scores)
        m = acc.compute()
        results.append({
            "baseline": f"feature_ctr:{feature}",
            "feature": feature,
            "auc": m.auc,
            "auc_bound": m.auc_bound,
            "logloss": m.logloss,
            "calibration": m.calibration,
            "smoothing": smoothing,
            "train_values": int(values.size),
        })
        logger.debug("baseline %s: auc=%s logloss=%s", feature, m.auc, m.logloss)
    return results
