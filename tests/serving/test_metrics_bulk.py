"""The server's metrics updated in bulk: the same text as one update per value, the same
out-of-vocabulary counts as the per-row definition."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ctrctl.inference.export import load_artifact
from ctrctl.serving import model_api
from ctrctl.serving.app import ServerState
from ctrctl.serving.batcher import Batcher, Job
from ctrctl.serving.config import ServeConfig
from ctrctl.serving.metrics import SCORE_BUCKETS, BulkHistogram, Metrics
from ctrctl.serving.requests import count_missing

from .conftest import Exported


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, BulkHistogram]:
    one, bulk = CollectorRegistry(), CollectorRegistry()
    args = ("ctrctl_score", "Scores returned.", ["model_version"])
    return (one, Histogram(*args, buckets=SCORE_BUCKETS, registry=one),
            bulk, BulkHistogram(*args, buckets=SCORE_BUCKETS, registry=bulk))


def _text(registry: CollectorRegistry) -> str:
    # the _created lines hold the time each child was made
    return "\n".join(line for line in generate_latest(registry).decode().splitlines()
                     if "_created" not in line)


def test_bulk_scores_give_the_text_of_one_observe_per_score() -> None:
    one_registry, one, bulk_registry, bulk = _pair()
    rng = np.random.default_rng(0)
    # multiples of 1/1024 (float32 scores as the program gives), so that every sum is exact
    # in any order; bounds themselves, 0, 1 and the edges of the range included
    for version, n in (("3", 270), ("3", 1), ("4", 1000)):
        scores = (rng.integers(0, 1025, n) / 1024).astype(np.float32)
        if n >= 3:
            scores[:3] = [0.05, 0.0, 1.0]
        for value in scores.tolist():
            one.labels(version).observe(value)
        bulk.labels(version).observe_many(scores)
    text = _text(bulk_registry)
    assert text == _text(one_registry)
    assert 'ctrctl_score_bucket{le="0.05",model_version="3"}' in text
    assert 'ctrctl_score_count{model_version="4"} 1000.0' in text


def test_bulk_observe_counts_every_value_in_its_bucket_and_nan_in_none() -> None:
    _, one_family, _, bulk_family = _pair()
    one, bulk = one_family.labels("3"), bulk_family.labels("3")
    values = np.array([0.05, 0.0500001, 0.99, 0.995, 2.0, -1.0, np.nan, 0.3])
    for value in values.tolist():
        one.observe(value)
    bulk.observe_many(values)
    bulk.observe_many(np.array([], dtype=np.float32))

    def buckets(h: Histogram) -> list[float]:
        return [b.get() for b in h._buckets]

    assert buckets(bulk) == buckets(one)
    assert sum(buckets(bulk)) == len(values) - 1  # the NaN is in no bucket, as observe()


def test_bulk_observe_writes_the_multiprocess_files(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import multiprocess, values

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    values.ValueClass = values.get_value_class()
    try:
        _, one, _, bulk = _pair()
        scores = np.arange(0, 1025, 7) / 1024
        for value in scores.tolist():
            one.labels("a").observe(value)
        bulk.labels("b").observe_many(scores)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
        lines = generate_latest(registry).decode().splitlines()
        a = sorted(line.replace('"a"', "V") for line in lines if '"a"' in line)
        b = sorted(line.replace('"b"', "V") for line in lines if '"b"' in line)
        assert a == b and len(a) == len(SCORE_BUCKETS) + 3  # + Inf, _sum, _count
    finally:
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
        values.ValueClass = values.get_value_class()
        assert os.environ.get("PROMETHEUS_MULTIPROC_DIR") is None


def test_out_of_vocabulary_counts_equal_the_per_row_definition(exported: Exported) -> None:
    """Per vocabulary feature: rows whose value is present (not None, not "") and encodes to
    id 0, the unknown row; with the None counts given by the caller or counted here."""
    model = load_artifact(exported.export)
    sparse = model.contract["sparse"]
    vocab = [f["name"] for f in sparse if f["mode"] == "vocab" and not f.get("separator")]
    records = exported.records(120)
    rng = np.random.default_rng(3)
    columns: dict[str, list[Any]] = {n: [r.get(n) for r in records]
                                     for n in model_api.input_columns(model)}
    for name in vocab:  # unseen values, nulls and empty strings in every vocabulary column
        values = columns[name]
        for i in rng.choice(len(values), 30, replace=False).tolist():
            values[i] = [f"{rng.integers(1 << 32):08x}", None, ""][i % 3]
    del columns[vocab[-1]]  # an absent column: every row missing, never out of vocabulary
    n = len(records)
    dense, ids, lengths = model_api.encode_columns(model, columns, n)
    by_feature = dict(zip([f["name"] for f in sparse],
                          ids.split(lengths.view(len(sparse), -1).sum(1).tolist()),
                          strict=True))
    expected = {name: sum(1 for v, i in zip(columns[name], by_feature[name].tolist(),
                                            strict=True) if v not in (None, "") and i == 0)
                for name in vocab if name in columns}
    assert sum(expected.values()) > 0
    for missing in (None, count_missing(columns, model_api.input_columns(model), n)):
        metrics = Metrics()
        batcher = Batcher(model, metrics, "v")
        job = Job(columns, n, 0.0, 0.0, None, missing=missing)  # type: ignore[arg-type]
        batcher._count_oov(job, (dense, ids, lengths))
        batcher._count_oov(job, (dense, ids, lengths))  # the cached counters add up
        got = {name: metrics.feature_oov.labels(name)._value.get() for name in vocab}
        assert got == {name: 2.0 * expected.get(name, 0) for name in vocab}


def test_request_metrics_keep_their_labels_with_cached_children(exported: Exported) -> None:
    state = ServerState(ServeConfig(model=str(exported.export)))
    for endpoint, status, version, seconds in (("score", "200", "3", 0.004),
                                               ("score", "200", "3", 0.012),
                                               ("rank", "422", "none", 0.001),
                                               ("score", "200", "4", 0.004)):
        state.observe_request(endpoint, status, version, seconds)
    text = state.metrics.render()[0].decode()
    score_3 = 'endpoint="score",model_version="3",status="200"'
    assert f"ctrctl_requests_total{{{score_3}}} 2.0" in text
    assert f"ctrctl_request_duration_seconds_count{{{score_3}}} 2.0" in text
    assert ('ctrctl_request_duration_seconds_bucket{endpoint="score",le="0.005",'
            'model_version="3",status="200"} 1.0' in text)
    assert ('ctrctl_requests_total{endpoint="rank",model_version="none",status="422"} 1.0'
            in text)
    assert 'ctrctl_requests_total{endpoint="score",model_version="4",status="200"} 1.0' in text
