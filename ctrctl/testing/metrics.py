"""Rank bodies of the metric tests: each rank feeds its slice, the synced metric comes back."""

from __future__ import annotations

from typing import Any

import numpy as np

ROWS = 20_000


def metric_rows(seed: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, float32 scores (with ties) and weights of a CTR-like model."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=ROWS)
    labels = (rng.random(ROWS) < 1 / (1 + np.exp(-(1.3 * x - 2.0)))).astype(np.int8)
    scores = np.round(1 / (1 + np.exp(-(x - 1.8))), 4).astype(np.float32)
    weights = rng.uniform(0.5, 2.0, size=ROWS)
    return labels, scores, weights


def metric_values(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None,
                  exact_limit: int, batch: int = 3_000) -> dict[str, float]:
    """Every ctrctl metric over the rows, fed in batches; synced when a group is open."""
    from ctrctl.metrics import (
        Calibration,
        CTRMetrics,
        ExpectedCalibrationError,
        LogLoss,
        NormalizedEntropy,
        StreamingAUC,
    )

    metrics: dict[str, Any] = {
        "ctr": CTRMetrics(num_bins=4096, exact_limit=exact_limit),
        "auc": StreamingAUC(num_bins=4096, exact_limit=exact_limit),
        "ece": ExpectedCalibrationError(num_bins=4096, exact_limit=exact_limit),
        "calibration": Calibration(), "ne": NormalizedEntropy(), "logloss": LogLoss(),
    }
    for start in range(0, labels.size, batch):
        part = slice(start, start + batch)
        for metric in metrics.values():
            metric.update(labels[part], scores[part],
                          None if weights is None else weights[part])
    out: dict[str, float] = {}
    ctr = metrics.pop("ctr").compute()
    out.update({f"ctr.{k}": v for k, v in ctr.scalars().items() if isinstance(v, float)})
    out["ctr.exact"] = float(ctr.auc_mode == "exact")
    auc = metrics.pop("auc").compute()
    out["auc"], out["auc_bound"] = float(auc["auc"]), float(auc["auc_bound"])
    out.update({name: float(metric.compute()) for name, metric in metrics.items()})
    return out


def synced_metrics_body(rank: int, world_size: int, weighted_ranks: tuple[int, ...]
                        ) -> dict[str, dict[str, float]]:
    """Rank ``rank`` feeds an uneven slice (with 3 ranks the last gets none), with weights only
    on ``weighted_ranks`` (None, meaning ones, elsewhere); exact and binned."""
    labels, scores, weights = metric_rows()
    cuts = [0, ROWS // 3, ROWS, ROWS][: world_size + 1]
    cuts[-1] = ROWS
    mine = slice(cuts[rank], cuts[rank + 1])
    w = weights[mine] if rank in weighted_ranks else None
    return {mode: metric_values(labels[mine], scores[mine], w, limit)
            for mode, limit in (("exact", ROWS), ("binned", 0))}
