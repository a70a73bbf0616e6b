"""POST /v1/recommend on a real server on 127.0.0.1, serving a bundle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ctrctl.inference.bundle import load_bundle
from tests.bundle_helpers import build_bundle
from tests.serving.conftest import Server, start_server

#: Trains a two-tower model and a DLRM, exports, bundles and serves them (about 40 s).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    bundle = build_bundle(tmp_path_factory.mktemp("recommend"))
    server = start_server(bundle, "--max-rows-per-request", "100")
    try:
        yield server, bundle
    finally:
        server.stop()


def test_recommend_answers_as_the_bundle_does(served: tuple[Server, Path]) -> None:
    server, bundle = served
    status, body, headers = server.post("/v1/recommend",
                                        {"query": {"user": "17"}, "k": 5, "candidates": 50})
    assert status == 200, body
    expected = load_bundle(bundle).recommend({"user": "17"}, k=5, candidates=50)
    assert body["items"] == expected.items.tolist() and body["candidates"] == 50
    np.testing.assert_allclose(body["scores"], expected.rank_scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(body["retrieval_scores"], expected.retrieval_scores,
                               rtol=1e-5, atol=1e-6)
    lower = {k.lower(): v for k, v in headers.items()}
    assert lower["x-model-version"] == body["model"]["version"]
    # the ranker stays served as any export
    status, ranked, _ = server.post("/v1/rank", {"context": {"user": "17"}, "candidates": [
        {"item": str(i)} for i in body["items"]]})
    assert status == 200 and np.allclose(ranked["scores"], body["scores"], atol=1e-6)


@pytest.mark.parametrize(("payload", "status", "error", "field"), [
    (b"{not json", 400, "invalid_json", None),
    ({"k": 5}, 422, "missing_field", "query"),
    ({"query": {"user": "1"}, "n": 3}, 422, "unknown_field", "n"),
    ({"query": {"user": "1"}, "k": 0}, 422, "wrong_type", "k"),
    ({"query": {"user": "1"}, "k": 20, "candidates": 10}, 422, "k_above_candidates", "k"),
    ({"query": {"user": "1"}, "candidates": 500}, 413, "too_many_rows", "candidates"),
    ({"query": {"usr": "1"}, "candidates": 50}, 422, "unknown_feature", "query.usr"),
    ({"query": {"user": [1]}}, 422, "wrong_type", "query.user"),
    ({"query": {"user": "x1"}, "candidates": 50}, 422, "invalid_value", "query.user"),
])
def test_a_bad_request_is_a_4xx_naming_the_problem(served: tuple[Server, Path], payload: object,
                                                   status: int, error: str,
                                                   field: str | None) -> None:
    server, _ = served
    got, body, _ = server.post("/v1/recommend", payload)
    assert (got, body["error"]) == (status, error), body
    assert body.get("field") == field and body["message"]


def test_loadgen_drives_recommend_and_checks_every_answer(served: tuple[Server, Path]) -> None:
    from ctrctl.serving.loadtest import RequestSet, recommend_queries, run_point

    server, bundle = served
    root = bundle.parent
    queries = recommend_queries(bundle, root / "ctr.tsv")
    assert len(queries) == 300 and set(queries[0]) == {"user"}  # one per user
    requests = RequestSet.recommend(queries, k=5, candidates=50, count=32)
    point = run_point(server.url, requests, rate=20.0, duration_s=1.5, protocol="recommend",
                      threads=4)
    assert point.errors == 0 and point.shed == 0 and point.ok == point.requests >= 20
    assert point.rows_per_s > 0 and point.p99_ms > 0
