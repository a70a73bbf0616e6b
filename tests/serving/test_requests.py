"""The request parser's fast path (orjson, columns by C-level passes) against the pydantic
envelope it falls back to: the same columns for every body either accepts, the same error
for every body it refuses; and the batcher's per-request bookkeeping."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import numpy as np
import pytest
import torch

from ctrctl.inference.export import load_artifact
from ctrctl.serving import model_api
from ctrctl.serving.batcher import Batcher, Job
from ctrctl.serving.metrics import Metrics
from ctrctl.serving.requests import ClientError, Parser, encode_response

from .conftest import Exported

COLUMNS = ["I1", "I2", "C1", "C2", "C3"]


def _slow(parser: Parser, body: bytes, endpoint: str) -> Any:
    """The pydantic path alone (the fast one made to decline)."""
    fast = parser._fast
    parser._fast = lambda *args: None  # type: ignore[method-assign]
    try:
        return _outcome(parser, body, endpoint)
    finally:
        parser._fast = fast  # type: ignore[method-assign]


def _outcome(parser: Parser, body: bytes, endpoint: str) -> Any:
    try:
        return getattr(parser, endpoint)(body)
    except ClientError as exc:
        return ("error", exc.status, exc.body)


def _random_value(rng: random.Random) -> Any:
    return rng.choice([None, "", "7", "68fd1e64", 3, -2, 0.5, 1e300, True, [1], {"a": 1},
                       2**70, "x" * 3])


def _random_body(rng: random.Random) -> bytes:
    names = COLUMNS + ["C9"] * (rng.random() < 0.1)
    rows: Any = [{n: _random_value(rng) for n in rng.sample(names, rng.randint(0, len(names)))}
                 for _ in range(rng.randint(0, 5))]
    if rng.random() < 0.3:  # one key order in every row: the transposing path
        rows = [{n: rng.choice(["1", None, 2.5]) for n in COLUMNS} for _ in range(4)]
    if rng.random() < 0.05:
        rows = rng.choice([{}, "rows", None, [1, 2]])
    body: dict[str, Any] = {"rows": rows}
    if rng.random() < 0.5:  # a /v1/rank body
        body = {"candidates": rows,
                "context": {n: _random_value(rng) for n in rng.sample(COLUMNS, 2)}}
    if rng.random() < 0.05:
        body["extra"] = 1
    text = json.dumps(body)
    if rng.random() < 0.03:
        text = text[:-1]  # not JSON
    return text.encode()


def test_the_fast_path_parses_as_the_pydantic_envelope_does() -> None:
    parser = Parser(COLUMNS, max_rows=4)
    rng = random.Random(0)
    fast_taken = 0
    for _ in range(600):
        body = _random_body(rng)
        for endpoint in ("score", "rank"):
            assert _outcome(parser, body, endpoint) == _slow(parser, body, endpoint), body
            fast_taken += parser._fast(body, "rows" if endpoint == "score" else "candidates",
                                       frozenset({"rows"}) if endpoint == "score" else
                                       frozenset({"candidates", "context"})) is not None
    assert fast_taken > 100  # the fast path took a good share of the bodies


def test_a_well_formed_body_never_reaches_pydantic() -> None:
    parser = Parser(COLUMNS, max_rows=1000)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pydantic's path ran")

    parser._parse = refuse  # type: ignore[method-assign]
    rows = [{"I1": "3", "C1": "68fd1e64"}, {"C1": None, "I2": 4.5}]
    columns, n = parser.score(json.dumps({"rows": rows}).encode())
    assert n == 2 and columns == {"I1": ["3", None], "I2": [None, 4.5],
                                  "C1": ["68fd1e64", None]}
    columns, n, context = parser.rank(json.dumps(
        {"context": {"C2": "a"}, "candidates": [{"C1": "b"}, {"C1": "c"}]}).encode())
    assert (columns, n, context) == ({"C1": ["b", "c"]}, 2, {"C2": "a"})


def test_the_response_keeps_every_score_digit() -> None:
    scores = np.array([0.1, 1 / 3, 2e-8], dtype=np.float32)
    body = json.loads(encode_response(scores, {"version": "1"}, "id"))
    assert np.array_equal(np.array(body["scores"], dtype=np.float32), scores)
    assert body["model"] == {"version": "1"} and body["request_id"] == "id"


def test_out_of_vocabulary_counts_present_unseen_values_only(exported: Exported) -> None:
    model = load_artifact(exported.export)
    metrics = Metrics()
    batcher = Batcher(model, metrics, "v")
    vocab = [f["name"] for f in model.contract["sparse"] if f["mode"] == "vocab"]
    assert vocab, "the test model has vocabulary features"
    name = vocab[0]
    f = [feature["name"] for feature in model.contract["sparse"]].index(name)

    def feature_id(value: str) -> int:
        ids = model_api.encode_columns(model, {name: [value]}, 1)[1]
        return int(ids[f])

    known = next(r[name] for r in exported.records(200) if feature_id(r.get(name, "")) != 0)
    values = [known, "0badf00d", None, "", "ffffffff", known]
    columns = {name: values}
    inputs = model_api.encode_columns(model, columns, 6)
    batcher._count_oov(Job(columns, 6, 0.0, 0.0, None), inputs)  # type: ignore[arg-type]
    assert metrics.feature_oov.labels(name)._value.get() == 2  # the two unseen values


def test_a_request_reaching_an_idle_batcher_does_not_wait(exported: Exported) -> None:
    model = load_artifact(exported.export)
    names = model_api.input_columns(model)
    columns = {n: [r.get(n) for r in exported.records(8)] for n in names}

    async def run() -> list[float]:
        batcher = Batcher(model, Metrics(), "v", max_wait_s=0.5)
        batcher.start()
        took = []
        for _ in range(2):
            start = time.monotonic()
            await batcher.submit(columns, 8, time.monotonic() + 5.0)
            took.append(time.monotonic() - start)
            await asyncio.sleep(0.6)  # idle again: longer than the wait
        await batcher.stop()
        return took

    took = asyncio.run(run())
    assert max(took) < 0.4, took  # a 0.5 s wait would show


@pytest.mark.parametrize("body", [b'{"rows": [{"I1": true}]}', b'{"rows": [{"I1": 1}],}'])
def test_bodies_the_fast_path_declines_get_pydantics_answer(body: bytes) -> None:
    parser = Parser(COLUMNS, max_rows=10)
    assert parser._fast(body, "rows", frozenset({"rows"})) is None
    assert _outcome(parser, body, "score") == _slow(parser, body, "score")


def test_an_idle_request_is_scored_inline_and_company_is_batched(exported: Exported) -> None:
    """The first request finds the batcher idle and is scored on the loop's thread; two that
    arrive while it is busy queue and share one model call. Scores equal the model's own."""
    model = load_artifact(exported.export)
    names = model_api.input_columns(model)
    records = exported.records(12)
    parts = [records[:4], records[4:9], records[9:]]
    columns = [{n: [r.get(n) for r in part] for n in names} for part in parts]
    metrics = Metrics()

    async def run() -> tuple[list[np.ndarray], int]:
        batcher = Batcher(model, metrics, "v", max_wait_s=0.05)
        batcher.start()
        deadline = time.monotonic() + 30.0
        got = await asyncio.gather(*(batcher.submit(c, len(p), deadline)
                                     for c, p in zip(columns, parts, strict=True)))
        inline = batcher.inline_requests
        await batcher.stop()
        return list(got), inline

    got, inline = asyncio.run(run())
    assert inline == 1
    expected = [np.asarray(model_api.score_columns(model, c, len(p)))
                for c, p in zip(columns, parts, strict=True)]
    np.testing.assert_array_equal(got[0], expected[0])  # alone, as the model's own call
    # the other two shared one call: a larger GEMM may round the last bit differently
    for scores, want in zip(got[1:], expected[1:], strict=True):
        torch.testing.assert_close(torch.from_numpy(scores), torch.from_numpy(want))
    batches = metrics.batch_rows.labels("v")
    assert batches._sum.get() == 12 and _count(batches) == 2  # 4 alone, then 5 + 3 as one


def _count(histogram: Any) -> float:
    return sum(bucket.get() for bucket in histogram._buckets)


def test_a_large_request_after_small_ones_is_not_refused_for_their_fixed_cost(
        exported: Exported) -> None:
    """A 1-row batch costs nearly all fixed time (a model call), not time per row: after a
    run of them, the deadline test still admits a 270-row request that its rate per row
    scores well within its deadline."""
    model = load_artifact(exported.export)
    names = model_api.input_columns(model)
    records = exported.records(270)
    one = {n: [records[0].get(n)] for n in names}
    many = {n: [r.get(n) for r in records] for n in names}

    async def run() -> np.ndarray:
        batcher = Batcher(model, Metrics(), "v", max_wait_s=0.001)
        batcher.warm({n: [None] * 256 for n in names}, 256)
        batcher.start()
        for _ in range(20):
            await batcher.submit(one, 1, time.monotonic() + 5.0)
            await asyncio.sleep(0.002)
        assert batcher.estimate(270) < 270 * batcher.estimate(1) / 4
        try:  # 270 times a 1-row call's time would not fit this deadline
            return await batcher.submit(many, 270, time.monotonic() + 0.2)
        finally:
            await batcher.stop()

    scores = asyncio.run(run())
    np.testing.assert_array_equal(scores, model_api.score_columns(model, many, 270))
