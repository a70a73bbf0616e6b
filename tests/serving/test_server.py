"""A real `ctrctl serve` (uvicorn on 127.0.0.1, a free port): scores, rank, bad requests,
metrics and the request log, on one server started and stopped by the module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from ctrctl.inference.predictor import predict_raw

from .conftest import Exported, Server, start_server


@pytest.fixture(scope="module")
def server(exported: Exported, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Server, Path]]:
    log_dir = tmp_path_factory.mktemp("request-log")
    server = start_server(exported.export, "--max-rows-per-request", "600",
                          "--log-dir", str(log_dir), "--max-wait-ms", "1")
    try:
        yield server, log_dir
    finally:
        if server.process.poll() is None:
            server.stop()


def test_http_scores_equal_predict_input(server: tuple[Server, Path], exported: Exported,
                                         tmp_path: Path) -> None:
    http, _ = server
    records = exported.records()
    assert 400 < len(records) <= 600
    status, body, headers = http.post("/v1/score", {"rows": records},
                                      headers={"X-Request-Id": "equal-1"})
    assert status == 200, body
    predict_raw(exported.export, exported.raw, tmp_path / "raw.parquet")
    offline = pq.read_table(tmp_path / "raw.parquet").column("score").to_numpy()
    assert np.array_equal(np.asarray(body["scores"], dtype=np.float32), offline)
    assert body["model"]["version"] == headers["x-model-version"]
    assert body["request_id"] == headers["x-request-id"] == "equal-1"


def test_rank_equals_score_of_the_merged_rows(server: tuple[Server, Path],
                                              exported: Exported) -> None:
    http, _ = server
    user = exported.records(1)[0]
    context = {k: v for k, v in user.items() if k in {f"C{i}" for i in range(1, 14)}}
    candidates = [{k: v for k, v in r.items() if k not in context}
                  for r in exported.records(40)]
    status, ranked, _ = http.post("/v1/rank", {"context": context, "candidates": candidates})
    assert status == 200, ranked
    merged = [{**c, **context} for c in candidates]
    status, scored, _ = http.post("/v1/score", {"rows": merged})
    assert status == 200
    assert ranked["scores"] == scored["scores"] and len(ranked["scores"]) == 40


BAD = [
    (b'{"rows": [', 400, "invalid_json", {}),
    (b'{"rows": []}', 422, "empty", {"field": "rows"}),
    (b'{"rows": {"I1": "3"}}', 422, "wrong_type", {"field": "rows"}),
    (b'{"rows": [{"I1": "3"}, 7]}', 422, "wrong_type", {"row": 1}),
    (b'{"rows": [{"I1": "3"}, {"C1": "ab", "C99": "1"}]}', 422, "unknown_feature",
     {"field": "C99", "row": 1}),
    (b'{"rows": [{"I1": "3"}, {"I2": "lots"}]}', 422, "invalid_value",
     {"field": "I2", "row": 1}),
    (b'{"rows": [{"I1": "3"}, {"C2": {"a": 1}}]}', 422, "wrong_type",
     {"field": "C2", "row": 1}),
    (b'{"rows": [{"C3": "not-hex"}]}', 422, "invalid_value", {"field": "C3", "row": 0}),
    (b'{"rows": [{}], "extra": 1}', 422, "unknown_field", {"field": "extra"}),
    (b'[1, 2]', 422, "invalid_body", {}),
]


@pytest.mark.parametrize(("body", "status", "error", "names"), BAD,
                         ids=[b[2] + str(i) for i, b in enumerate(BAD)])
def test_each_bad_request_gets_its_4xx_and_the_next_is_served(
        server: tuple[Server, Path], exported: Exported, body: bytes, status: int, error: str,
        names: dict[str, object]) -> None:
    http, _ = server
    got, answer, _ = http.post("/v1/score", body)
    assert (got, answer["error"]) == (status, error), answer
    assert answer["message"] and (status == 400 or answer.get("expected"))
    for key, value in names.items():
        assert answer[key] == value, answer
    good, scored, _ = http.post("/v1/score", {"rows": exported.records(3)})
    assert good == 200 and len(scored["scores"]) == 3


def test_too_many_rows_and_rank_mistakes(server: tuple[Server, Path],
                                         exported: Exported) -> None:
    http, _ = server
    status, body, _ = http.post("/v1/score", {"rows": [{}] * 601})
    assert status == 413 and body["error"] == "too_many_rows" and "600" in body["expected"]
    status, body, _ = http.post("/v1/rank", {"context": {"C1": "ab"},
                                             "candidates": [{"C2": "1"}, {"C1": "cd"}]})
    assert status == 422 and (body["field"], body["candidate"]) == ("C1", 1), body
    status, body, _ = http.post("/v1/rank", {"context": {"C77": "ab"}, "candidates": [{}]})
    assert status == 422 and body["field"] == "context.C77"
    status, body, _ = http.post("/v1/rank", {"context": {}, "candidates": [{"I1": "3"},
                                                                            {"I4": "x"}]})
    assert status == 422 and (body["field"], body["candidate"]) == ("I4", 1), body
    status, body, _ = http.post("/v1/rank", {"context": {"I1": "x"}, "candidates": [{}]})
    assert status == 422 and body["field"] == "context.I1", body
    assert http.post("/v1/rank", {"candidates": exported.records(2)})[0] == 200


def test_model_health_and_metrics(server: tuple[Server, Path], exported: Exported) -> None:
    http, _ = server
    assert http.get("/healthz")[0] == 200
    status, text = http.get("/v1/model")
    assert status == 200 and '"columns"' in text and '"lineage"' in text
    http.post("/v1/score", {"rows": [{"I1": "1"}, {"I1": "2", "C5": "zz"}]})
    status, text = http.get("/metrics")
    assert status == 200
    for name in ("ctrctl_request_duration_seconds_bucket", "ctrctl_requests_total",
                 "ctrctl_queue_wait_seconds_count", "ctrctl_batch_rows_count",
                 "ctrctl_score_bucket", "ctrctl_feature_missing_total",
                 "ctrctl_feature_values_total", "ctrctl_log_dropped_total"):
        assert name in text, name
    missing = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
               if line.startswith("ctrctl_feature_missing_total{")}
    assert missing['ctrctl_feature_missing_total{feature="C26"}'] >= 2
    assert 'endpoint="score",model_version="none",status="413"' in text or \
        'status="422"' in text
