"""Online serving on the demo model: `ctrctl serve` under MLPerf LoadGen beside `mlflow models
serve` of the same model and offline `ctrctl predict --dataset`.

One model in the shape of ``pipelines/demo.yaml`` (criteo_vocab schema, dim 16, dense arch
64,16, over arch 64,32,1, dot interaction, INT8 tables) is trained for one epoch on
synthetic Criteo logs, exported, and then:

* ``ctrctl serve`` (one worker on this machine's cores) is swept over ``--rates`` with
  LoadGen's Server scenario (Poisson arrivals), ``--candidates`` raw rows per request
  sampled from the test logs; achieved rate, p50/p95/p99/p99.9, errors and shed per rate,
  and the highest rate at p99 <= ``--p99-ms``;
* ``mlflow models serve`` of the same artifact's pyfunc model, swept the same way
  (``dataframe_records`` bodies) over ``--mlflow-rates``, with the highest rate at p99 <=
  50 ms;
* ``ctrctl predict --dataset`` on the preprocessed test split: rows/s (the ceiling);
* MFLOP per candidate of the dense part (the MLPs and the dot interaction), so that other
  systems' rows/s can be compared fairly.

TorchRec's inference path on CPU (``quantize_inference_model``) is measured in-process by
``scripts/bench_inference.py``; TorchRec's own server is a C++ program that is not built
here.

Usage:
    python scripts/bench_serve.py [--quick] [--out bench-out/serve.json]

Before/after a change, on the same model and rows, one run after the other::

    git archive OLD_COMMIT | tar -x -C /tmp/old   # plus the native .so files
    python scripts/bench_serve.py --work W --serve-only --tree /tmp/old --out before.json
    python scripts/bench_serve.py --work W --serve-only --out after.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from ctrctl.modules.native import cpu_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = ["model.embedding_dim=16", "model.dense_arch=[64,16]", "model.over_arch=[64,32,1]",
         "model.interaction=dot", "training.epochs=1", "training.val_every=0",
         "training.checkpoint_every=0", "training.device=cpu", "training.num_workers=1"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows, shorter runs")
    parser.add_argument("--out", type=Path, default=Path("bench-out/serve.json"))
    parser.add_argument("--rows", type=int, default=60_000, help="synthetic log rows")
    parser.add_argument("--rates", default="5,20,40,80,120,160",
                        help="ctrctl serve: requests/s")
    parser.add_argument("--mlflow-rates", default="0.5,1,2,4,8",
                        help="mlflow serve: requests/s (far enough to find its rate at p99 <= "
                             "50 ms)")
    parser.add_argument("--duration-s", type=float, default=20.0, help="seconds per rate")
    parser.add_argument("--candidates", default="270", help="rows per request, or dlrmv2")
    parser.add_argument("--p99-ms", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--work", type=Path, default=None, help="keep the model here")
    parser.add_argument("--soak-s", type=float, default=0.0,
                        help="then serve --soak-rate requests/s this long (0: no soak)")
    parser.add_argument("--soak-rate", default="auto",
                        help="requests/s, or auto: 70%% of the highest ctrctl rate at p99 <= "
                             "--p99-ms (at p99 <= 50 ms where none met it)")
    parser.add_argument("--skip-sweep", action="store_true",
                        help="only the soak (with --soak-s)")
    parser.add_argument("--serve-only", action="store_true",
                        help="only the ctrctl serve sweep (no mlflow, offline, memory)")
    parser.add_argument("--tree", type=Path, default=None,
                        help="serve with the ctrctl of this checkout (default: this one), "
                             "e.g. an older commit's `git archive` for a before/after run")
    parser.add_argument("--threads", type=int, default=None,
                        help="ctrctl serve --threads (default: the server's choice)")
    parser.add_argument("--mlflow-only", action="store_true",
                        help="only the mlflow models serve sweep")
    parser.add_argument("--dedup-only", action="store_true",
                        help="only /v1/rank's context deduplication at 512 candidates")
    parser.add_argument("--memory-export", type=Path, default=None,
                        help="measure the workers' memory on this export (default: the "
                             "bench model)")
    return parser.parse_args(argv)


def build_model(work: Path, rows: int) -> dict[str, Path]:
    from ctrctl.config import load_config
    from ctrctl.data.preprocess import preprocess
    from ctrctl.data.synthetic import synthesize
    from ctrctl.inference.export import write_artifact
    from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
    from ctrctl.training.loop import train

    export = work / "export"
    if (export / "manifest.json").is_file():
        return {"export": export, "dataset": work / "ds", "raw": work / "logs" / "test.tsv"}
    synthesize(work / "logs", rows=rows, format="criteo", seed=0,
               splits={"train": 0.8, "test": 0.2})
    preprocess(ROOT / "schemas" / "criteo_vocab.yaml",
               [f"train={work / 'logs' / 'train.tsv'}", f"test={work / 'logs' / 'test.tsv'}"],
               work / "ds", val_fraction=0.05)
    run = train(work / "ds", work / "run", load_config(None, MODEL))
    write_artifact(quantize_checkpoint(run.checkpoint, QuantizeConfig(dtype="int8")), export,
                   dataset=work / "ds")
    return {"export": export, "dataset": work / "ds", "raw": work / "logs" / "test.tsv"}


def mflop_per_candidate(export: Path) -> float:
    """Multiply-adds x 2 of the dense layers and the dot interaction, per row, in MFLOP."""
    from safetensors import safe_open

    manifest = json.loads((export / "manifest.json").read_text())
    flops = 0
    with safe_open(str(export / "dense.safetensors"), "pt") as handle:
        for name in handle.keys():
            shape = handle.get_slice(name).get_shape()
            if len(shape) == 2 and not name.endswith("_scale"):
                flops += 2 * shape[0] * shape[1]
    features = len(manifest["input"]["sparse"]) + 1
    dim = max(int(t["dim"]) for t in manifest["tables"])
    flops += features * features * dim  # the Gram matrix's pairs (half of 2 F^2 D)
    return flops / 1e6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[Any], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the server exited {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url}: not ready in {timeout} s")


def stop(process: subprocess.Popen[Any]) -> int:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def sweep_server(command: list[str], ready: str, url: str, requests: Any, rates: list[float],
                 duration: float, protocol: str, p99_ms: float, env: dict[str, str],
                 cwd: Path = ROOT) -> dict[str, Any]:
    from ctrctl.serving.loadtest import highest_rate, sweep

    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    points, cpu_ms = [], []
    try:
        wait_ready(ready, process)
        # every rate, past the first miss: the curve, not only the answer; one rate at a
        # time, to read the server process's CPU time around each
        for rate in sorted(rates):
            before = _cpu_seconds(process.pid)
            [point] = sweep(url, requests, [rate], duration, protocol=protocol,
                            p99_ms=p99_ms, stop_after_miss=False)
            points.append(point)
            answered = point.to_dict()["requests"]
            cpu_ms.append(1000 * (_cpu_seconds(process.pid) - before) / answered
                          if answered else None)
    finally:
        code = stop(process)
    best = highest_rate(points, p99_ms)
    bounds = {str(int(b)): (found.offered_qps if (found := highest_rate(points, b)) else None)
              for b in sorted({p99_ms, 10.0, 50.0})}
    return {"command": " ".join(command), "exit_code": code,
            "points": [p.to_dict() for p in points], "p99_bound_ms": p99_ms,
            # the server's CPU time per answered request: every process of its tree (the
            # workers of ctrctl serve --workers N, mlflow's launcher and its server)
            "server_cpu_ms_per_request": cpu_ms,
            "highest_rate": best.offered_qps if best else None,
            "highest_rate_by_p99_ms": bounds}


def rank_dedup(export: Path, raw: Path, candidates: int = 512, repeats: int = 15,
               threads: int = 1) -> dict[str, Any]:
    """``/v1/rank``'s scoring of one request of ``candidates`` with half the features in the
    context, three ways, taking turns: the merged rows encoded and scored (``merged``); the
    context encoded once, its ids broadcast (``context_encoded_once``); the context encoded
    and looked up once, its pooled vectors broadcast into the dense stage
    (``context_pooled_once``). ms per request (median, min, max) and whether the scores
    are bitwise equal to the merged rows'."""
    import random
    import statistics

    import torch

    from ctrctl.inference.export import load_artifact
    from ctrctl.serving import model_api
    from ctrctl.serving.batcher import encode_with_context, pool_with_context
    from ctrctl.serving.loadtest import read_raw_rows

    torch.set_num_threads(threads)
    model = load_artifact(export)
    names = model_api.input_columns(model)
    rows = read_raw_rows(export, raw, limit=5000)
    pick = random.Random(0)
    chosen = [rows[pick.randrange(len(rows))] for _ in range(candidates)]
    shared = set(names[::2])
    context = {k: v for k, v in chosen[0].items() if k in shared}
    alone = [{k: v for k, v in r.items() if k not in shared} for r in chosen]
    merged = [{**c, **context} for c in alone]

    def columns(rs: list[dict[str, str]]) -> dict[str, list[Any]]:
        present = set().union(*rs)
        return {n: [r.get(n) for r in rs] for n in names if n in present}

    full_columns, alone_columns = columns(merged), columns(alone)

    def pooled_once() -> torch.Tensor:
        found = pool_with_context(model, alone_columns, candidates, context)
        assert found is not None, "the artifact has no stages (format 1)"
        return model.score_pooled(found[0], found[1])

    ways = {"merged": lambda: model.score(*model_api.encode_columns(model, full_columns,
                                                                      candidates)),
            "context_encoded_once": lambda: model.score(*encode_with_context(
                model, alone_columns, candidates, context)),
            "context_pooled_once": pooled_once}
    with torch.no_grad():
        want = ways["merged"]()
        equal = {name: bool(torch.equal(way(), want)) for name, way in ways.items()}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            times[name].append((time.perf_counter() - start) * 1000)
    return {"candidates": candidates, "context_features": len(shared), "threads": threads,
            "bitwise_equal": equal, "load": os.getloadavg(),
            **{f"{k}_ms": {"median": statistics.median(v), "min": min(v), "max": max(v)}
               for k, v in times.items()}}


def _table_mappings(pid: int, tables: Path) -> dict[str, int]:
    """Bytes of ``pid``'s mappings of the table files: resident, private, shared."""
    out = {"rss": 0, "private": 0, "shared": 0}
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            inside = len(head) >= 6 and head[5].startswith(str(tables))
        elif inside and len(head) == 3 and head[2] == "kB":
            key, kb = head[0].rstrip(":"), int(head[1]) * 1024
            if key == "Rss":
                out["rss"] += kb
            elif key in ("Private_Clean", "Private_Dirty"):
                out["private"] += kb
            elif key in ("Shared_Clean", "Shared_Dirty"):
                out["shared"] += kb
    return out


def worker_memory(export: Path, env: dict[str, str], workers: int = 2) -> dict[str, Any]:
    """Serve ``export`` with ``workers`` processes; per worker, its whole RSS and the table
    files' pages in it (private ones would be copies; shared ones are the file's)."""
    tables = (export / "tables").resolve()
    table_bytes = sum(p.stat().st_size for p in tables.glob("*.safetensors"))
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ctrctl", "serve", str(export), "--port", str(port),
         "--workers", str(workers)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", process)
        time.sleep(5)  # every worker loaded and warmed
        children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True,
                                  text=True).stdout.split()
        found = []
        for pid in map(int, children):
            mapped = _table_mappings(pid, tables)
            if mapped["rss"] == 0:
                continue  # uvicorn's helper process, no model
            status = Path(f"/proc/{pid}/status").read_text()
            rss = next(int(line.split()[1]) * 1024 for line in status.splitlines()
                       if line.startswith("VmRSS"))
            found.append({"pid": pid, "rss": rss, "table_pages": mapped})
    finally:
        stop(process)
    return {"export": str(export), "table_bytes": table_bytes, "workers": found,
            "private_table_bytes_per_worker_over_table_bytes": [
                w["table_pages"]["private"] / max(table_bytes, 1) for w in found]}


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a server's workers, mlflow's launcher's server)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(child) for child in task.read_text().split()]
            except OSError:  # the task ended while we looked
                continue
    return found


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds so far of process ``pid`` and its live descendants (their
    threads, and their children that ended, included): a server's whole CPU time, whatever
    its number of worker processes."""
    total = 0
    for member in _process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited between the listing and the read
            continue
        # utime + stime, and cutime + cstime: children that ended and were waited for
        total += sum(int(value) for value in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines()
                if line.startswith("VmRSS"))


def soak(export: Path, requests: Any, rate: float, seconds: float, env: dict[str, str]
         ) -> dict[str, Any]:
    """``ctrctl serve`` (one worker) at ``rate`` for ``seconds`` after a 30 s warm-up at the
    same rate: errors, shed, percentiles, and the server's RSS at the start and the end."""
    import threading

    from ctrctl.serving.loadtest import run_point

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ctrctl", "serve", str(export), "--port", str(port),
         "--workers", "1"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        start = time.monotonic()
        while not done.wait(10.0):
            samples.append((time.monotonic() - start, _rss(process.pid)))

    try:
        wait_ready(url + "/readyz", process)
        run_point(url, requests, rate, 30.0)  # warm-up: allocator and caches settle
        watcher = threading.Thread(target=sample, daemon=True)
        samples.append((0.0, _rss(process.pid)))
        watcher.start()
        point = run_point(url, requests, rate, seconds)
        done.set()
        watcher.join()
        samples.append((seconds, _rss(process.pid)))
    finally:
        code = stop(process)
    first, last = samples[0][1], samples[-1][1]
    return {"rate": rate, "seconds": seconds, "point": point.to_dict(), "exit_code": code,
            "rss_start": first, "rss_end": last, "rss_growth": last / first - 1,
            "rss_max": max(r for _, r in samples)}


def offline_rows_per_s(export: Path, dataset: Path, work: Path, repeats: int) -> list[float]:
    from ctrctl.inference.predictor import predict_dataset

    out = []
    for _ in range(repeats):
        result = predict_dataset(export, dataset, "test", work / "scores.parquet",
                                 overwrite=True)
        out.append(result.rows_per_s)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.rows, args.duration_s = min(args.rows, 20_000), min(args.duration_s, 10.0)
    from ctrctl.serving.loadtest import RequestSet, read_raw_rows

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    result: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(),
                              "load_before": os.getloadavg()}
    try:
        paths = build_model(work, args.rows)
        if args.dedup_only:
            result["rank_dedup"] = rank_dedup(paths["export"], paths["raw"], repeats=30)
            result["load_after"] = os.getloadavg()
            return _write(args, result)
        rows = read_raw_rows(paths["export"], paths["raw"])
        candidates = args.candidates if args.candidates == "dlrmv2" else int(args.candidates)
        rates = [float(r) for r in args.rates.split(",")]
        if args.skip_sweep:
            if args.soak_s > 0:
                result["soak"] = soak(paths["export"], RequestSet.sample(rows, candidates),
                                      float(args.soak_rate), args.soak_s, env)
            result["load_after"] = os.getloadavg()
            return _write(args, result)
        if not args.mlflow_only:
            _sweep_ctrctl(args, paths, rows, candidates, rates, env, result)
        if args.serve_only:
            result["load_after"] = os.getloadavg()
            return _write(args, result)

        import mlflow.pyfunc

        from ctrctl.inference.pyfunc import MODEL_CODE, REQUIREMENTS

        pyfunc = work / "pyfunc"
        shutil.rmtree(pyfunc, ignore_errors=True)
        mlflow.pyfunc.save_model(str(pyfunc), python_model=str(MODEL_CODE),
                                 artifacts={"export": str(paths["export"])},
                                 pip_requirements=REQUIREMENTS)
        port = free_port()
        result["mlflow_models_serve"] = sweep_server(
            [str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", str(pyfunc),
             "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
            f"http://127.0.0.1:{port}/ping", f"http://127.0.0.1:{port}",
            RequestSet.sample(rows, candidates, protocol="mlflow"),
            [float(r) for r in args.mlflow_rates.split(",")], args.duration_s, "mlflow", 50.0,
            env)
        if args.mlflow_only:
            result["load_after"] = os.getloadavg()
            return _write(args, result)
        offline = offline_rows_per_s(paths["export"], paths["dataset"], work,
                                     2 if args.quick else 3)
        result["predict_dataset_rows_per_s"] = offline
        result["targets"] = _targets(result, candidates)
        if args.soak_s > 0:
            rate = (float(args.soak_rate) if args.soak_rate != "auto" else
                    0.7 * (result["targets"]["ctrctl_rate_p99_10ms"]
                           or result["targets"]["ctrctl_rate_p99_50ms"] or 5.0))
            result["soak"] = soak(paths["export"], RequestSet.sample(rows, candidates),
                                  rate, args.soak_s, env)
        result["rank_dedup"] = rank_dedup(paths["export"], paths["raw"])
        result["worker_memory"] = worker_memory(args.memory_export or paths["export"], env)
        result["mflop_per_candidate"] = mflop_per_candidate(paths["export"])
        result["candidates"] = args.candidates
        result["torchrec"] = ("TorchRec's CPU inference path (quantize_inference_model) is "
                              "measured in-process by scripts/bench_inference.py; its server "
                              "is a C++ program not built here")
    finally:
        result["load_after"] = os.getloadavg()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return _write(args, result)


def _sweep_ctrctl(args: argparse.Namespace, paths: dict[str, Path], rows: Any,
                  candidates: int | str, rates: list[float], env: dict[str, str],
                  result: dict[str, Any]) -> None:
    from ctrctl.serving.loadtest import RequestSet

    port = free_port()
    tree = (args.tree or ROOT).resolve()
    command = [sys.executable, "-m", "ctrctl", "serve", str(paths["export"]), "--port",
               str(port), "--workers", str(args.workers)]
    command += ["--threads", str(args.threads)] if args.threads else []
    result["ctrctl_serve"] = sweep_server(
        command, f"http://127.0.0.1:{port}/readyz", f"http://127.0.0.1:{port}",
        RequestSet.sample(rows, candidates), rates, args.duration_s, "ctrctl",
        args.p99_ms, {**env, "PYTHONPATH": str(tree)}, cwd=tree)
    result["ctrctl_serve"]["tree"] = str(tree)


def _targets(result: dict[str, Any], candidates: int | str) -> dict[str, Any]:
    """The issue's targets against what the run measured (None where a rate was not found)."""
    import statistics

    ours = result["ctrctl_serve"]["highest_rate_by_p99_ms"]
    theirs = result["mlflow_models_serve"]["highest_rate_by_p99_ms"]
    offline = statistics.median(result["predict_dataset_rows_per_s"])
    rows = 270 if candidates == "dlrmv2" else int(candidates)  # dlrmv2: mean about 270
    at_10, at_50, mlflow_50 = ours.get("10"), ours.get("50"), theirs.get("50")
    return {"ctrctl_rate_p99_10ms": at_10, "ctrctl_rate_p99_50ms": at_50,
            "mlflow_rate_p99_50ms": mlflow_50,
            "ratio_ctrctl_p99_10ms_over_mlflow": (at_10 / mlflow_50 if at_10 and mlflow_50
                                                  else None),
            "ratio_ctrctl_p99_50ms_over_mlflow": (at_50 / mlflow_50 if at_50 and mlflow_50
                                                  else None),
            "offline_rows_per_s": offline,
            "share_of_offline_at_p99_10ms": (at_10 * rows / offline if at_10 else None)}


def _write(args: argparse.Namespace, result: dict[str, Any]) -> int:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
