"""Ranks evaluate their slices; the merged metrics equal one process's on all the rows.

One spawn of ranks checks the exact path (rows gathered), the binned path (histograms
all-reduced) and the per-segment state (value lists unified, then summed).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.evaluation.segments import SegmentAccumulator
from ctrctl.metrics.streaming import CTRMetrics

ROWS = 90_000


def rows(seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=ROWS)
    labels = (rng.random(ROWS) < 1 / (1 + np.exp(-(1.2 * x - 2.5)))).astype(np.int8)
    scores = (1 / (1 + np.exp(-(x - 2.4)))).astype(np.float32)
    device = rng.choice(np.array(["phone", "tablet", "desktop", "tv"]), size=ROWS,
                        p=[0.6, 0.25, 0.14, 0.01])
    return labels, scores, device


def evaluate_rows(labels: np.ndarray, scores: np.ndarray, device: np.ndarray,
                  batch: int = 7_000, sync: bool = False) -> dict[str, Any]:
    exact = CTRMetrics()
    binned = CTRMetrics(exact_limit=0)
    segments = SegmentAccumulator("device", num_bins=256, exact_limit=0)
    for start in range(0, labels.size, batch):
        part = slice(start, start + batch)
        exact.update(labels[part], scores[part])
        binned.update(labels[part], scores[part])
        segments.update(device[part], labels[part], scores[part])
    if sync:
        segments.sync()
    out: dict[str, Any] = {}
    for name, acc in (("exact", exact), ("binned", binned)):
        m = acc.compute()
        out[name] = {k: v for k, v in m.scalars().items() if isinstance(v, (int, float))}
        out[name]["mode"] = m.auc_mode
    out["segments"] = {r["segment"]: r for r in segments.compute()}
    return out


def _rank_body(rank: int, world_size: int) -> dict[str, Any]:
    labels, scores, device = rows()
    # uneven slices, and rank 1 meets the segment values in another order
    cuts = np.linspace(0, ROWS, world_size + 1).astype(int)
    cuts[1] += 1234
    mine = np.arange(cuts[rank], cuts[rank + 1])
    if rank == 1:
        mine = mine[::-1]
    return evaluate_rows(labels[mine], scores[mine], device[mine], sync=True)


def _close(actual: float, expected: float, what: str) -> None:
    torch.testing.assert_close(torch.tensor(actual, dtype=torch.float64),
                               torch.tensor(expected, dtype=torch.float64), msg=what)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "world_size", [3, pytest.param(2, marks=pytest.mark.slow)]
)
def test_ranks_combine_exactly(world_size: int) -> None:
    per_rank = run_multiprocess(_rank_body, world_size)
    labels, scores, device = rows()
    single = evaluate_rows(labels, scores, device)
    reference = roc_auc_score(labels, scores.astype(np.float64))
    for result in per_rank:
        for mode in ("exact", "binned"):
            assert result[mode]["mode"] == mode
            for key, value in single[mode].items():
                if key != "mode":
                    _close(result[mode][key], value, f"{mode} {key}")
        assert result["exact"]["auc"] == pytest.approx(reference, abs=1e-6)
        assert abs(result["binned"]["auc"] - reference) <= result["binned"]["auc_bound"]
        assert set(result["segments"]) == set(single["segments"])
        for name, row in result["segments"].items():
            for key in ("rows", "positives", "auc", "auc_bound", "logloss", "calibration"):
                _close(row[key], single["segments"][name][key], f"segment {name} {key}")
