"""Per-segment metrics against scikit-learn on each segment's rows."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

from ctrctl.evaluation.segments import OTHER, SegmentAccumulator


def rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    segment = rng.choice(np.array(["phone", "tablet", "desktop", "tv"]), size=n,
                         p=[0.6, 0.25, 0.14, 0.01])
    shift = np.select([segment == "phone", segment == "tablet"], [-2.5, -1.5], -1.0)
    x = rng.normal(size=n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-(x + shift)))).astype(np.int8)
    scores = np.round(1 / (1 + np.exp(-(0.8 * x + shift + 0.2))), 5)
    return segment, labels, scores


@pytest.mark.parametrize("exact_limit", [10**7, 0])
def test_segments_match_sklearn(exact_limit: int) -> None:
    segment, labels, scores = rows(40_000)
    acc = SegmentAccumulator("device", exact_limit=exact_limit, num_bins=1 << 14)
    for start in range(0, labels.size, 5_000):
        part = slice(start, start + 5_000)
        acc.update(segment[part], labels[part], scores[part])
    table = acc.compute()
    assert [r["segment"] for r in table] == ["phone", "tablet", "desktop", "tv"]
    for row in table:
        sel = segment == row["segment"]
        assert row["rows"] == sel.sum()
        assert row["auc"] == pytest.approx(
            roc_auc_score(labels[sel], scores[sel]), abs=max(row["auc_bound"], 1e-6)
        )
        assert row["logloss"] == pytest.approx(log_loss(labels[sel], scores[sel]), abs=1e-6)
        assert row["calibration"] == pytest.approx(scores[sel].sum() / labels[sel].sum())
        if exact_limit:
            assert row["auc_bound"] == 0.0
            assert row["pr_auc"] == pytest.approx(
                average_precision_score(labels[sel], scores[sel]), abs=1e-6
            )


def test_one_class_segment_and_overflow_to_other() -> None:
    values = np.array([1, 1, 2, 2, 3, 3, 4, 4])
    labels = np.array([0, 0, 0, 1, 1, 0, 1, 0])
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    acc = SegmentAccumulator("site", max_segments=2)
    acc.update(values, labels, scores)
    table = {r["segment"]: r for r in acc.compute()}
    assert set(table) == {1, 2, OTHER}
    assert table[1]["auc"] is None and table[1]["calibration"] is None  # no clicks: no NaN
    assert table[2]["auc"] == 1.0
    assert table[OTHER]["rows"] == 4
