"""Latency of POST /v1/recommend: K candidates retrieved and ranked, at a fixed request rate.

Builds a MovieLens-100k bundle (``../shared/data/movielens-100k/u.data``): a two-tower model
(``pipelines/movielens_two_tower.yaml``, a few epochs) with an HNSW index of its items and
INT8 query tables, and a DLRM ranker (``schemas/movielens.yaml``, one epoch, INT8 tables);
serves it with ``ctrctl serve`` (one worker) on 127.0.0.1, and drives ``/v1/recommend`` with
MLPerf LoadGen's Server scenario (Poisson arrivals) at ``--rate`` requests/s, each request a
user from the test log ranking ``--candidates`` items and returning ``--k``. The load
generator runs on the same machine. Each repeat is one LoadGen run; the report gives p50
and p99 per repeat, their median and spread, and the load average before and after.

Usage:
    python scripts/bench_recommend.py [--rate 50] [--candidates 200] [--repeats 3] \
        [--json benchmarks/results/<cpu>/recommend.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from render_performance import add_json_argument, load_average, write_result  # noqa: E402

from ctrctl.io import write_json_atomic  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data" / "movielens-100k" / "u.data"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="MovieLens u.data")
    parser.add_argument("--work", type=Path, default=None, help="keep the models here")
    parser.add_argument("--epochs", type=int, default=3, help="two-tower training epochs")
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s offered")
    parser.add_argument("--duration-s", type=float, default=20.0, help="seconds per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=200, help="K: items ranked")
    parser.add_argument("--k", type=int, default=10, help="N: items returned")
    parser.add_argument("--threads", type=int, default=8, help="client connections")
    parser.add_argument("--out", type=Path, default=Path("bench-out/recommend.json"))
    add_json_argument(parser)
    return parser.parse_args(argv)


def build_bundle(work: Path, data: Path, epochs: int) -> Path:
    """Train, export and bundle both models under ``work`` (reused when already there)."""
    from ctrctl.config import load_config
    from ctrctl.data.preprocess import preprocess
    from ctrctl.inference.bundle import make_bundle
    from ctrctl.inference.export import quantize_to_artifact
    from ctrctl.inference.quantize import QuantizeConfig
    from ctrctl.inference.retrieval import export_retrieval
    from ctrctl.retrieval.indexing import index_checkpoint
    from ctrctl.training.loop import train

    bundle = work / "bundle"
    if (bundle / "bundle.json").is_file():
        return bundle
    preprocess(REPO / "schemas" / "movielens_retrieval.yaml", [str(data)], work / "tt-ds",
               overwrite=True)
    train(work / "tt-ds", work / "tt", load_config(
        REPO / "pipelines" / "movielens_two_tower.yaml",
        [f"training.epochs={epochs}", "training.num_workers=1"]), overwrite=True)
    index_checkpoint(work / "tt", work / "index", kind="hnsw", overwrite=True)
    export_retrieval(work / "tt", work / "index", work / "retrieval", overwrite=True)
    preprocess(REPO / "schemas" / "movielens.yaml", [str(data)], work / "ctr-ds",
               split_ratio=(0.8, 0.1, 0.1), overwrite=True)
    train(work / "ctr-ds", work / "ctr", load_config(None, [
        "training.epochs=1", "training.num_workers=1", "training.val_every=0"]),
        overwrite=True)
    quantize_to_artifact(work / "ctr", work / "ranker", QuantizeConfig(), overwrite=True,
                         log_model=False)
    make_bundle(work / "retrieval", work / "ranker", bundle, overwrite=True)
    return bundle


def serve(bundle: Path, port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "ctrctl", "serve", str(bundle), "--port", str(port),
         "--workers", "1"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"ctrctl serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return process
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise SystemExit("ctrctl serve was not ready in 300 s")


def measure(args: argparse.Namespace, bundle: Path, raw: Path) -> dict[str, Any]:
    import socket

    from ctrctl.serving.loadtest import RequestSet, recommend_queries, run_point

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    queries = recommend_queries(bundle, raw)
    requests = RequestSet.recommend(queries, args.k, args.candidates, count=512)
    process = serve(bundle, port)
    runs = []
    try:
        url = f"http://127.0.0.1:{port}"
        run_point(url, requests, args.rate, 3.0, protocol="recommend", threads=args.threads)
        for _ in range(args.repeats):
            point = run_point(url, requests, args.rate, args.duration_s,
                              protocol="recommend", threads=args.threads, p99_ms=20.0)
            runs.append({**point.to_dict(), "loadavg": Path("/proc/loadavg").read_text()
                         .strip()})
            print(f"{point.offered_qps:g}/s offered, {point.achieved_qps:.1f}/s achieved: "
                  f"p50 {point.p50_ms:.2f} ms, p99 {point.p99_ms:.2f} ms, errors "
                  f"{point.errors}, shed {point.shed}; load {runs[-1]['loadavg']}", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=60)
    p99 = [r["p99_ms"] for r in runs]
    p50 = [r["p50_ms"] for r in runs]
    return {"runs": runs, "queries": len(queries), "p99_ms_median": statistics.median(p99),
            "p99_ms_spread": [min(p99), max(p99)], "p50_ms_median": statistics.median(p50),
            "errors": sum(r["errors"] for r in runs), "shed": sum(r["shed"] for r in runs)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.data.is_file():
        print(f"no MovieLens data at {args.data}: nothing measured")
        return 1
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="bench-recommend-") as tmp:
        work = args.work or Path(tmp)
        started = time.perf_counter()
        bundle = build_bundle(work, args.data, args.epochs)
        built_s = time.perf_counter() - started
        result = measure(args, bundle, args.data)
    result.update({"rate": args.rate, "candidates": args.candidates, "k": args.k,
                   "repeats": args.repeats, "duration_s": args.duration_s,
                   "build_seconds": built_s, "load_before": load_before,
                   "load_after": load_average()})
    write_json_atomic(args.out, result)
    print(f"p99 {result['p99_ms_median']:.2f} ms (median of {args.repeats}; "
          f"{result['p99_ms_spread'][0]:.2f}-{result['p99_ms_spread'][1]:.2f}) at "
          f"{args.rate:g}/s, K={args.candidates}; results: {args.out}")
    if args.json:
        write_result(
            args.json, "recommend", "Retrieve then rank: POST /v1/recommend "
            "(`scripts/bench_recommend.py`)",
            f"MovieLens-100k bundle: two-tower (HNSW index of the items, INT8 query tables) "
            f"then a DLRM ranker (INT8 tables); one server worker on 127.0.0.1, LoadGen "
            f"Server scenario on the same machine, {args.duration_s:g} s per repeat; each "
            f"request a user, {args.candidates} candidates ranked, {args.k} returned; "
            f"p99: median over {args.repeats} repeats [min-max].",
            ["case", "p50 ms", "p99 ms", "errors / shed"],
            [{"values": {"case": f"{args.rate:g} requests/s, K={args.candidates}",
                         "p50 ms": f"{result['p50_ms_median']:.2f}",
                         "p99 ms": f"{result['p99_ms_median']:.2f} "
                                   f"[{result['p99_ms_spread'][0]:.2f}-"
                                   f"{result['p99_ms_spread'][1]:.2f}]",
                         "errors / shed": f"{result['errors']} / {result['shed']}"}}],
            load_before=load_before)
        print(f"performance table in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
