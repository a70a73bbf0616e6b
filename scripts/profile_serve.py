"""Where one ``/v1/score`` request of raw rows spends its time, stage by stage.

Stages are timed in this process on the same body the load test sends (parse + envelope
validation, the features' missing counts, the encoder, the exported program, the response
JSON), then the whole request is timed over HTTP against ``ctrctl serve`` on a free port
(one request at a time, so the gap between the sum of the stages and the HTTP time is
uvicorn, the batcher's hops and the event loop). ``--cprofile N`` prints the top N
functions of the in-process path by cumulative time.

Usage:
    python scripts/profile_serve.py --export EXPORT --raw test.tsv [--rows 270] [--repeats 50]
        [--threads 2] [--cprofile 25] [--gap-ms 20] [--out bench-out/profile-serve.json]
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, required=True)
    parser.add_argument("--raw", type=Path, required=True, help="a log file in the schema")
    parser.add_argument("--rows", type=int, default=270, help="rows per request")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--cprofile", type=int, default=0, help="print the top N functions")
    parser.add_argument("--no-http", action="store_true", help="stages only")
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="also time the whole in-process path after this long idle "
                             "before each request (a cold core, as between requests)")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def _summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"median_ms": statistics.median(ms), "min_ms": ms[0],
            "p90_ms": ms[int(0.9 * (len(ms) - 1))], "max_ms": ms[-1]}


def time_stages(export: Path, body: bytes, repeats: int, cprofile: int, gap_ms: float = 0.0
                ) -> dict[str, dict[str, float]]:
    """Each stage of the in-process path, timed ``repeats`` times (after a warm-up)."""
    import torch

    from ctrctl.inference import standalone
    from ctrctl.serving import model_api
    from ctrctl.serving.requests import Parser, count_missing, encode_response

    model = standalone.load(str(export))
    parser = Parser(model_api.input_columns(model), 4096)
    columns, n_rows = parser.score(body)
    inputs = model_api.encode_columns(model, columns, n_rows)
    scores = model.score(*inputs).numpy()
    stages: dict[str, Callable[[], Any]] = {
        "parse": lambda: parser.score(body),
        "count_missing": lambda: count_missing(columns, parser.columns, n_rows),
        "encode": lambda: model_api.encode_columns(model, columns, n_rows),
        "score": lambda: model.score(*inputs),
        "response": lambda: encode_response(scores, {"name": "m", "version": "1"}, "id"),
    }

    def whole() -> None:
        cols, n = parser.score(body)
        count_missing(cols, parser.columns, n)
        out = model.score(*model_api.encode_columns(model, cols, n)).numpy()
        encode_response(out, {"name": "m", "version": "1"}, "id")

    stages["in_process_total"] = whole
    times: dict[str, list[float]] = {name: [] for name in stages}
    with torch.no_grad():
        for _ in range(5):
            whole()
        for _ in range(repeats):
            for name, stage in stages.items():
                start = time.perf_counter()
                stage()
                times[name].append(time.perf_counter() - start)
        if cprofile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(repeats):
                whole()
            profile.disable()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(cprofile)
        if gap_ms:  # the whole path again with the process idle in between, as a server is
            times[f"in_process_total_after_{gap_ms:g}_ms_idle"] = gapped = []
            for _ in range(repeats):
                time.sleep(gap_ms / 1000.0)
                start = time.perf_counter()
                whole()
                gapped.append(time.perf_counter() - start)
    return {name: _summary(t) for name, t in times.items()}


def time_http(export: Path, body: bytes, repeats: int, threads: int | None
              ) -> dict[str, float]:
    """One request at a time over a keep-alive connection to ``ctrctl serve``."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_serve import free_port, stop, wait_ready

    port = free_port()
    command = [sys.executable, "-m", "ctrctl", "serve", str(export), "--port", str(port),
               "--workers", "1"]
    if threads:
        command += ["--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", process)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        samples = []
        for i in range(repeats + 10):
            start = time.perf_counter()
            connection.request("POST", "/v1/score", body,
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
            if i >= 10:  # warm-up
                samples.append(time.perf_counter() - start)
            time.sleep(0.02)  # an idle server between requests, as at a low rate
        connection.close()
    finally:
        stop(process)
    return _summary(samples)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from ctrctl.modules.native import cpu_model
    from ctrctl.serving.loadtest import RequestSet, read_raw_rows

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = read_raw_rows(args.export, args.raw, limit=5000)
    body = RequestSet.sample(rows, args.rows, count=1).bodies[0]
    result: dict[str, Any] = {"cpu": cpu_model(), "rows": args.rows, "repeats": args.repeats,
                              "torch_threads": torch.get_num_threads(),
                              "body_bytes": len(body), "load_before": os.getloadavg()}
    result["stages"] = time_stages(args.export, body, args.repeats, args.cprofile, args.gap_ms)
    if not args.no_http:
        result["http"] = time_http(args.export, body, args.repeats, args.threads)
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
