"""PSI, sparse top-K drift, ECE and the request-log join against brute-force references."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrctl.data.reference import bin_shares, quantile_edges, top_ids
from ctrctl.errors import DatasetError
from ctrctl.monitoring.drift import EPS, dense_drift, psi, sparse_drift
from ctrctl.monitoring.join import join_labels, read_request_log
from ctrctl.monitoring.monitor import labelled_metrics


def _psi_loop(expected: list[float], actual: list[float]) -> float:
    total = 0.0
    for e, a in zip(expected, actual, strict=True):
        e, a = max(e, EPS), max(a, EPS)
        total += (a - e) * math.log(a / e)
    return total


def test_dense_psi_over_training_quantiles_matches_a_loop() -> None:
    rng = np.random.default_rng(0)
    train = rng.normal(size=5000)
    new = rng.normal(0.5, 1.2, size=3000)
    edges = quantile_edges(train, 10)
    ref = {"edges": edges, "shares": bin_shares(train, edges)}
    assert ref["shares"] == pytest.approx([0.1] * 10, abs=1e-3)
    # brute force: each value's bin by walking the edges
    counts = [0] * (len(edges) + 1)
    for v in new:
        counts[sum(1 for e in edges if v > e)] += 1
    expected = _psi_loop(ref["shares"], [c / len(new) for c in counts])
    assert dense_drift(ref, new)["psi"] == pytest.approx(expected, rel=1e-12)
    assert dense_drift(ref, rng.normal(size=3000))["psi"] < 0.02 < expected
    assert psi([0.5, 0.5], [0.5, 0.5]) == 0.0


def test_sparse_psi_over_top_ids_and_other_matches_a_loop() -> None:
    rng = np.random.default_rng(1)
    train = rng.zipf(1.5, size=4000) % 200
    new = rng.zipf(1.3, size=2000) % 300
    top, shares, other = top_ids(train, 5)
    counted = {i: int((train == i).sum()) for i in set(train.tolist())}
    brute_top = sorted(counted, key=lambda i: (-counted[i], i))[:5]
    assert top == brute_top
    ref = {"top": top, "shares": shares, "other": other, "default_rate": 0.0}
    observed = [sum(1 for v in new if v == i) / len(new) for i in top]
    expected = _psi_loop([*shares, other], [*observed, 1 - sum(observed)])
    got = sparse_drift(ref, new)
    assert got["psi"] == pytest.approx(expected, rel=1e-12)
    assert got["default_rate"] == pytest.approx(float((new == 0).mean()))


def test_ece_and_calibration_match_brute_force() -> None:
    rng = np.random.default_rng(2)
    scores = rng.uniform(0.01, 0.6, size=1000)
    labels = (rng.uniform(size=1000) < scores * 0.8).astype(np.int8)
    got = labelled_metrics(labels, scores, bins=10)
    order = np.argsort(scores, kind="stable")
    ece = 0.0
    for part in np.array_split(order, 10):  # 1000 rows: ten equal-mass bins of 100
        ece += len(part) / 1000 * abs(scores[part].mean() - labels[part].mean())
    assert got["ece"] == pytest.approx(ece, rel=1e-9)
    assert got["calibration"] == pytest.approx(scores.sum() / labels.sum(), rel=1e-12)


def test_join_matches_a_dictionary_join(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    log_rows, expected = [], {}
    t = 0
    for r in range(40):
        for _ in range(int(rng.integers(1, 5))):
            log_rows.append((f"req{r}", t, float(rng.uniform()), str(rng.integers(9))))
            t += 1
    for part, chunk in enumerate((log_rows[:50], log_rows[50:])):
        pq.write_table(pa.table({
            "request_id": [x[0] for x in chunk],
            "time": pa.array([x[1] for x in chunk], pa.timestamp("us", tz="UTC")),
            "model_version": ["1"] * len(chunk), "score": [x[2] for x in chunk],
            "C1": [x[3] for x in chunk]}), tmp_path / f"requests-{part:03d}.parquet")
    log = read_request_log(tmp_path)
    position: dict[str, int] = {}
    labels = []
    for request_id, _, score, _ in log_rows:
        row = position.get(request_id, 0)
        position[request_id] = row + 1
        if rng.uniform() < 0.7:
            label = int(rng.integers(2))
            labels.append((request_id, row, label))
            expected[(request_id, row)] = (score, label)
    labels.append(("never-logged", 0, 1))
    table = pa.table({"request_id": [x[0] for x in labels], "row": [x[1] for x in labels],
                      "label": [x[2] for x in labels]})
    joined, counts = join_labels(log, table)
    got = {(a, b): (s, y) for a, b, s, y in zip(
        joined.column("request_id").to_pylist(), joined.column("row").to_pylist(),
        joined.column("score").to_pylist(), joined.column("label").to_pylist(), strict=True)}
    assert got == expected
    assert counts == {"logged": len(log_rows), "labels": len(labels), "joined": len(expected),
                      "unlabelled": len(log_rows) - len(expected), "unmatched_labels": 1}
    with pytest.raises(DatasetError, match="more than once"):
        join_labels(log, pa.concat_tables([table, table.slice(0, 1)]))
