"""Load tests of a running ranker on MLPerf's own LoadGen (``mlcommons-loadgen``).

LoadGen's Server scenario issues queries at Poisson-distributed times for a target rate;
each query here is one HTTP request of raw rows sampled from a log file (a fixed number of
candidates, or a DLRMv2-like spread). The requests go out from a pool of keep-alive
connections and LoadGen is told of each completion. Latency is measured per request, from
the moment LoadGen issued it to the last byte of the answer, and every answer is checked:
a 200 must hold one score per row; a 503 counts as shed, anything else as an error.

Three protocols: ``ctrctl`` (``POST /v1/score {"rows": [...]}``), ``mlflow``
(``POST /invocations {"dataframe_records": [...]}``, what ``mlflow models serve`` takes) and
``recommend`` (``POST /v1/recommend {"query": {...}, "k": N, "candidates": K}`` of a served
bundle: each request's "rows" are the N items it returns).

Example:
    >>> rows = read_raw_rows("export", "test.tsv", limit=20_000)
    >>> requests = RequestSet.sample(rows, candidates=270, count=512, seed=0)
    >>> points = sweep("http://127.0.0.1:8080", requests, rates=[10, 20, 40], duration_s=20)
    >>> highest_rate(points, p99_ms=10.0)
"""

from __future__ import annotations

import http.client
import json
import math
import queue
import tempfile
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.errors import ConfigError, InputDataError

#: MLPerf DLRMv2's queries hold 100-700 samples, about 270 on average; this spread (a
#: log-normal clipped to [100, 700], mean ~270) stands in for its table of quantiles.
DLRMV2_RANGE = (100, 700)


def dlrmv2_counts(count: int, seed: int = 0) -> np.ndarray:
    """``count`` candidate counts in [100, 700] with a mean of about 270."""
    rng = np.random.default_rng(seed)
    counts = np.exp(rng.normal(math.log(240.0), 0.45, size=count))
    return np.clip(np.rint(counts), *DLRMV2_RANGE).astype(np.int64)


def read_raw_rows(export: str | Path, raw: str | Path, limit: int = 50_000
                  ) -> list[dict[str, str]]:
    """Raw rows of a log file in the model's schema, as the server takes them (the input
    columns only; empty fields left out)."""
    from ctrctl.data.readers import ROW, scan_input
    from ctrctl.data.schema import Schema
    from ctrctl.inference import standalone

    export = Path(export)
    manifest = standalone.verify(str(export))
    dataset = json.loads((export / "dataset" / "manifest.json").read_text()) \
        if (export / "dataset" / "manifest.json").is_file() else None
    if not dataset or not dataset.get("schema"):
        raise InputDataError("the artifact records no schema, so raw rows cannot be read",
                             where=str(export))
    schema = Schema.from_dict(dataset["schema"], where=str(export / "dataset"))
    contract = manifest["input"]
    names = [f["name"] for f in contract["dense"]] + [f["name"] for f in contract["sparse"]]
    frame = scan_input(schema, Path(raw)).frame.drop(ROW).select(names).head(limit)
    rows = frame.collect(engine="streaming").to_dicts()
    if not rows:
        raise InputDataError("no rows", where=str(raw))
    return [{k: v for k, v in row.items() if v is not None} for row in rows]


#: The path each protocol posts to.
PATHS = {"ctrctl": "/v1/score", "mlflow": "/invocations", "recommend": "/v1/recommend"}


def recommend_queries(bundle: str | Path, raw: str | Path, limit: int = 50_000
                      ) -> list[dict[str, str]]:
    """Distinct queries (the bundle's query columns) of a log file in its ranker's schema."""
    bundle = Path(bundle)
    columns = json.loads((bundle / "bundle.json").read_text())["query_columns"]
    seen: dict[tuple[Any, ...], dict[str, str]] = {}
    for row in read_raw_rows(bundle / "ranker", raw, limit):
        query = {c: row[c] for c in columns if c in row}
        seen.setdefault(tuple(sorted(query.items())), query)
    return list(seen.values())


@dataclass
class RequestSet:
    """Request bodies, encoded once before the test (the client's cost stays small)."""

    bodies: list[bytes]
    rows: list[int]

    @classmethod
    def sample(cls, rows: list[dict[str, str]], candidates: int | str, count: int = 256,
               seed: int = 0, protocol: str = "ctrctl") -> RequestSet:
        """``count`` requests of ``candidates`` rows each (or ``"dlrmv2"``), drawn from
        ``rows`` with replacement."""
        if candidates == "dlrmv2":
            sizes = dlrmv2_counts(count, seed)
        else:
            sizes = np.full(count, int(candidates), dtype=np.int64)
        rng = np.random.default_rng(seed + 1)
        bodies, lengths = [], []
        for size in sizes.tolist():
            picked = [rows[i] for i in rng.integers(0, len(rows), size=size).tolist()]
            key = "rows" if protocol == "ctrctl" else "dataframe_records"
            bodies.append(json.dumps({key: picked}).encode())
            lengths.append(size)
        return cls(bodies, lengths)

    @classmethod
    def recommend(cls, queries: list[dict[str, str]], k: int, candidates: int,
                  count: int = 256, seed: int = 0) -> RequestSet:
        """``count`` ``/v1/recommend`` requests of queries drawn from ``queries``."""
        rng = np.random.default_rng(seed + 1)
        picked = rng.integers(0, len(queries), size=count).tolist()
        bodies = [json.dumps({"query": queries[i], "k": k, "candidates": candidates}).encode()
                  for i in picked]
        return cls(bodies, [k] * count)


@dataclass
class Point:
    """One offered rate's outcome."""

    offered_qps: float
    achieved_qps: float
    rows_per_s: float
    requests: int
    ok: int
    shed: int
    errors: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    p999_ms: float
    mean_rows: float
    loadgen: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Client:
    """A pool of threads with one keep-alive connection each."""

    def __init__(self, url: str, path: str, threads: int, timeout_s: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.path = path
        self.timeout_s = timeout_s
        self.jobs: queue.Queue[Any] = queue.Queue()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join(timeout=self.timeout_s)

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)

    def _run(self) -> None:
        connection = self._connect()
        while True:
            job = self.jobs.get()
            if job is None:
                connection.close()
                return
            body, rows, issued, done = job
            status = 0
            for _attempt in range(2):
                try:
                    status = self._post(connection, body, rows)
                    break
                except (http.client.RemoteDisconnected, BrokenPipeError,
                        ConnectionResetError):
                    # an idle keep-alive connection the server closed: reconnect, once
                    connection.close()
                    connection = self._connect()
                except (OSError, http.client.HTTPException, ValueError):
                    connection.close()
                    connection = self._connect()
                    break
            done(status, time.perf_counter() - issued)

    def _post(self, connection: http.client.HTTPConnection, body: bytes, rows: int) -> int:
        connection.request("POST", self.path, body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        if response.status != 200:
            return response.status
        answer = json.loads(payload)
        scores = answer.get("scores", answer.get("predictions"))
        if not isinstance(scores, list) or len(scores) != rows:
            return -1  # a 200 without one score per row is an error
        return 200


def run_point(url: str, requests: RequestSet, rate: float, duration_s: float, *,
              protocol: str = "ctrctl", threads: int = 32, p99_ms: float = 10.0,
              timeout_s: float = 30.0, seed: int = 0) -> Point:
    """One LoadGen Server-scenario run at ``rate`` queries per second for ``duration_s``."""
    import mlperf_loadgen as lg

    path = PATHS[protocol]
    client = _Client(url, path, threads, timeout_s)
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: list[int] = []
    rows_done = [0]

    def issue(samples: list[Any]) -> None:
        now = time.perf_counter()
        for sample in samples:
            index = sample.index

            def done(status: int, seconds: float, sample_id: int = sample.id,
                     rows: int = requests.rows[index]) -> None:
                with lock:
                    statuses.append(status)
                    latencies.append(seconds)
                    if status == 200:
                        rows_done[0] += rows
                lg.QuerySamplesComplete([lg.QuerySampleResponse(sample_id, 0, 0)])

            client.jobs.put((requests.bodies[index], requests.rows[index], now, done))

    def flush() -> None:
        pass

    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = float(rate)
    settings.server_target_latency_ns = int(p99_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_duration_ms = int(duration_s * 1000)
    settings.max_duration_ms = int(duration_s * 1000 * 3 + 10_000)
    settings.min_query_count = max(1, int(rate * duration_s))
    settings.schedule_rng_seed = seed
    settings.sample_index_rng_seed = seed + 1
    count = len(requests.bodies)
    sut = lg.ConstructSUT(issue, flush)
    qsl = lg.ConstructQSL(count, count, lambda _: None, lambda _: None)
    with tempfile.TemporaryDirectory(prefix="ctrctl-loadgen-") as out:
        log = lg.LogSettings()
        log.log_output.outdir = out
        log.log_output.copy_summary_to_stdout = False
        log.enable_trace = False
        started = time.perf_counter()
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log)
        finally:
            elapsed = time.perf_counter() - started
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
            client.close()
        summary = _summary(Path(out) / "mlperf_log_summary.txt")
    return _point(rate, elapsed, statuses, latencies, rows_done[0], summary)


def _summary(path: Path) -> dict[str, str]:
    """A few lines of LoadGen's own summary (its scheduled rate and its verdict)."""
    keep = ("Scheduled samples per second", "Completed samples per second", "Result is",
            "99.00 percentile latency (ns)", "Min duration satisfied")
    out: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in keep:
                out[key.strip()] = value.strip()
    return out


def _point(rate: float, elapsed: float, statuses: list[int], latencies: list[float],
           rows: int, summary: dict[str, str]) -> Point:
    codes = np.asarray(statuses)
    ok = codes == 200
    served = np.asarray(latencies)[ok] * 1000.0 if ok.any() else np.asarray([math.nan])
    q = np.quantile(served, [0.5, 0.95, 0.99, 0.999])
    return Point(offered_qps=rate, achieved_qps=int(ok.sum()) / elapsed,
                 rows_per_s=rows / elapsed, requests=len(statuses), ok=int(ok.sum()),
                 shed=int((codes == 503).sum()), errors=int(((codes != 200) &
                                                             (codes != 503)).sum()),
                 p50_ms=float(q[0]), p95_ms=float(q[1]), p99_ms=float(q[2]),
                 p999_ms=float(q[3]), mean_rows=rows / max(int(ok.sum()), 1),
                 loadgen=summary)


def sweep(url: str, requests: RequestSet, rates: list[float], duration_s: float, *,
          protocol: str = "ctrctl", threads: int = 32, p99_ms: float = 10.0,
          stop_after_miss: bool = True) -> list[Point]:
    """:func:`run_point` at each rate in turn, stopping after the first rate that misses
    the p99 bound (or sheds or fails) when ``stop_after_miss``."""
    if not rates:
        raise ConfigError("give at least one rate", where="--rates")
    points = []
    for rate in sorted(rates):
        point = run_point(url, requests, rate, duration_s, protocol=protocol,
                          threads=threads, p99_ms=p99_ms)
        points.append(point)
        if stop_after_miss and not _meets(point, p99_ms):
            break
    return points


def _meets(point: Point, p99_ms: float) -> bool:
    return point.errors == 0 and point.shed == 0 and point.p99_ms <= p99_ms


def highest_rate(points: list[Point], p99_ms: float) -> Point | None:
    """The highest offered rate served with p99 <= ``p99_ms``, no errors and nothing shed."""
    good = [p for p in points if _meets(p, p99_ms)]
    return max(good, key=lambda p: p.offered_qps) if good else None
