"""Serving under stress: overload sheds fast, SIGTERM drains, a tampered artifact is refused."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from .conftest import ROOT, Exported, start_server


def _timed_post(server, body, headers=None):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    status, answer, got = server.post("/v1/score", body, headers=headers)
    return status, answer, got, time.perf_counter() - start


@pytest.mark.slow
def test_overload_gives_fast_503s(exported: Exported) -> None:
    # One request of 600 rows fills the queue; every request behind it is refused at once,
    # and a deadline the measured speed cannot meet is refused before it queues.
    server = start_server(exported.export, "--max-rows-per-request", "600",
                          "--max-queue-rows", "600", "--max-wait-ms", "50")
    try:
        rows = (exported.records() * 2)[:600]
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(lambda _: _timed_post(server, {"rows": rows}), range(24)))
        statuses = [r[0] for r in results]
        assert set(statuses) <= {200, 503} and statuses.count(503) >= 6, statuses
        served = sorted(r[3] for r in results if r[0] == 200)
        shed = sorted(r[3] for r in results if r[0] == 503)
        assert all(int(r[2]["retry-after"]) >= 1 for r in results if r[0] == 503)
        assert all(r[1]["error"] == "overloaded" for r in results if r[0] == 503)
        # shed answers come back sooner than the requests that were served
        assert shed[len(shed) // 2] < served[len(served) // 2], (shed, served)
        _, metrics = server.get("/metrics")
        assert 'ctrctl_shed_total{reason="queue_full"}' in metrics
        assert server.post("/v1/score", {"rows": rows[:5]})[0] == 200
    finally:
        code, output = server.stop()
    assert code == 0, output


@pytest.mark.slow
def test_sustained_overload_sheds_at_arrival_and_keeps_serving_in_time(
        exported: Exported) -> None:
    # 16 clients keep 16 requests in flight, about 16 requests' work, with a deadline of 4:
    # the batcher refuses at arrival what its measured rate cannot finish in time, and
    # serves the rest (admitting everything, it timed requests out only at their deadline
    # and served almost none: a queue of requests nobody waited for).
    server = start_server(exported.export, "--max-rows-per-request", "600",
                          "--max-wait-ms", "1")
    rows = (exported.records() * 2)[:300]
    try:
        probe = sorted(_timed_post(server, {"rows": rows})[3] for _ in range(5))[2]
        deadline_ms = max(4 * probe * 1000, 50.0)
        headers = {"X-Timeout-Ms": f"{deadline_ms:.0f}"}
        stop_at = time.monotonic() + 8
        body = json.dumps({"rows": rows}).encode()

        def client(_: int) -> list[tuple[int, float]]:
            out = []
            while time.monotonic() < stop_at:
                status, _, _, seconds = _timed_post(server, body, headers)
                out.append((status, seconds))
                if status == 503:
                    time.sleep(0.05)  # a client backs off (Retry-After says 1 s)
            return out

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = [r for part in pool.map(client, range(16)) for r in part]
        _, metrics = server.get("/metrics")
    finally:
        code, output = server.stop()
    assert code == 0, output
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 503}
    assert statuses.count(200) >= 8 and statuses.count(503) >= 8, (statuses, probe)
    at_arrival = next(float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith('ctrctl_shed_total{reason="deadline"}'))
    assert at_arrival >= 1


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_flushes_the_log_and_exits_0(
        exported: Exported, tmp_path: Path) -> None:
    server = start_server(exported.export, "--max-wait-ms", "400", "--log-dir",
                          str(tmp_path / "log"), "--timeout-ms", "20000")
    rows = exported.records(5)
    assert server.post("/v1/score", {"rows": [{"I1": "x"}]})[0] == 422  # not logged
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(server.post, "/v1/score", {"rows": rows},
                               {"X-Request-Id": f"r{i}"}) for i in range(8)]
        time.sleep(0.15)  # the requests are in the batcher, waiting out --max-wait-ms
        server.process.send_signal(signal.SIGTERM)
        results = [f.result() for f in futures]
    code, output = server.stop()
    assert code == 0, output
    assert [r[0] for r in results] == [200] * 8
    table = pq.read_table(tmp_path / "log")  # flushed before the exit
    assert table.num_rows == 8 * 5
    assert sorted(set(table.column("request_id").to_pylist())) == [f"r{i}" for i in range(8)]
    by_request = table.filter(pc.equal(table.column("request_id"), "r3"))
    assert by_request.column("C1").to_pylist() == [r.get("C1") for r in rows]
    assert by_request.column("score").to_pylist() == results[3][1]["scores"]


def test_a_tampered_artifact_is_refused_at_load_naming_the_file(exported: Exported,
                                                                tmp_path: Path) -> None:
    copy = tmp_path / "export"
    shutil.copytree(exported.export, copy)
    table = copy / "tables" / "shard-00000.safetensors"
    data = bytearray(table.read_bytes())
    data[-1] ^= 0xFF
    table.write_bytes(bytes(data))
    result = subprocess.run([sys.executable, "-m", "ctrctl", "serve", str(copy), "--port",
                             "1", "--workers", "1"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert str(table) in result.stdout + result.stderr
    assert "sha256" in result.stdout + result.stderr


@pytest.mark.slow
def test_two_workers_serve_share_metrics_and_stop_on_sigterm(exported: Exported) -> None:
    server = start_server(exported.export, "--workers", "2")
    try:
        for i in range(12):
            status, body, _ = server.post("/v1/score", {"rows": exported.records(3)},
                                          headers={"X-Request-Id": f"w{i}"})
            assert status == 200 and len(body["scores"]) == 3
        _, metrics = server.get("/metrics")  # summed over the workers' files
        total = sum(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("ctrctl_requests_total{") and 'status="200"' in line)
        assert total == 12
    finally:
        code, output = server.stop()
    assert code == 0, output
