"""Plan quality and speed: ctrctl's planner against TorchRec 1.8.0's, in one run.

For each table set x topology, both planners plan the same tables on the same topology
(TorchRec's defaults: 32 GiB HBM, 897 GiB/s, 8 ranks per host); TorchRec's plan is converted
to a ctrctl ShardingPlan and both are scored by ctrctl's cost model, so the ratio compares
the plans, not the models. TorchRec runs in a child process with a time limit per case.

    .venv/bin/python scripts/bench_planner.py            # full suite
    .venv/bin/python scripts/bench_planner.py --quick    # small and fast
    .venv/bin/python scripts/bench_planner.py --scale [--json benchmarks/results/<cpu>/planner.json]

``--scale`` times ctrctl's planner alone on 1,000 and 10,000 tables x 64, 4,096 and 16,384
ranks (rows log-uniform in 10^2..10^6, dim 64, 80 GB HBM, 8 ranks per host, a global batch of
16,384), one fresh process per case: planning seconds, the process's peak RSS and the plan's
estimated step; also a set that does not fit (refused by the capacity sums), and 26 tables
on 64 ranks in process.

Columns: slowest-rank estimate of each plan (ms), ratio ctrctl / TorchRec (< 1: ctrctl's
plan is faster), planning seconds of each (median of repeats for ctrctl).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from render_performance import add_json_argument, load_average, write_result

from ctrctl.distributed.planner import EmbeddingShardingPlanner, TableSpec, Topology, rate_plan
from ctrctl.distributed.planner.suites import (
    criteo_1tb,
    few_huge_many_small,
    random_tables,
    skewed,
    uniform,
)
from ctrctl.distributed.types import ParameterSharding, ShardingPlan, ShardMetadata
from ctrctl.errors import PlanError
from ctrctl.io import write_json_atomic


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small, fast variant")
    parser.add_argument("--out", type=Path, default=Path("bench-out/planner.json"))
    parser.add_argument("--repeats", type=int, default=3, help="ctrctl plans per case")
    parser.add_argument("--torchrec-timeout", type=float, default=None,
                        help="seconds TorchRec may take per case (default 20 quick, 120 full)")
    parser.add_argument("--batch-size", type=int, default=512, help="per rank")
    parser.add_argument("--no-torchrec", action="store_true", help="skip the reference")
    parser.add_argument("--scale", action="store_true",
                        help="time and peak memory at 1,000-10,000 tables x 64-16,384 ranks")
    parser.add_argument("--case-timeout", type=float, default=120.0,
                        help="seconds one --scale case may take")
    add_json_argument(parser)
    return parser.parse_args(argv)


# ---- --scale: one fresh process per case -------------------------------------------------
#: (name, tables, ranks, largest rows, dim): the production-scale sets of issue 30.
SCALE_CASES = [
    ("1,000 x 64", 1000, 64, 10**6, 64), ("1,000 x 4,096", 1000, 4096, 10**6, 64),
    ("1,000 x 16,384", 1000, 16384, 10**6, 64), ("10,000 x 64", 10000, 64, 10**6, 64),
    ("10,000 x 4,096", 10000, 4096, 10**6, 64), ("10,000 x 16,384", 10000, 16384, 10**6, 64),
    ("does not fit: 10,000 x 4,096, rows to 10^9, dim 512", 10000, 4096, 10**9, 512),
]
GLOBAL_BATCH = 16384


def scale_tables(num_tables: int, max_rows: int, dim: int, seed: int = 0) -> list[TableSpec]:
    """Row counts log-uniform in 10^2..``max_rows``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = np.exp(rng.uniform(np.log(1e2), np.log(max_rows), num_tables)).astype(np.int64)
    return [TableSpec(f"t{i}", int(r), dim) for i, r in enumerate(rows)]


def scale_case(num_tables: int, world: int, max_rows: int, dim: int) -> dict[str, Any]:
    """Plan one case in this process; what a --scale row reports (peak RSS included)."""
    import resource

    tables = scale_tables(num_tables, max_rows, dim)
    topo = Topology.preset("h100", world, 8)
    batch = max(GLOBAL_BATCH // world, 1)
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        result = EmbeddingShardingPlanner(topo, batch).plan(tables)
        outcome = {"step_ms": result.step_time * 1e3, "fits": True,
                   "imbalance": result.imbalance}
    except PlanError as exc:
        outcome = {"fits": False, "message": exc.message[:160]}
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu_start  # the process's own CPU time: what the load hides
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mib": rss,
            "batch_per_rank": batch, **outcome}


def run_scale(args: argparse.Namespace) -> int:
    """Each case in a child process (its own peak RSS), bounded by ``--case-timeout``."""
    import json
    import os
    import subprocess

    load_before = load_average()
    rows: list[dict[str, Any]] = []
    here = str(Path(__file__).resolve().parent)
    for name, tables, world, max_rows, dim in SCALE_CASES:
        code = (f"import json, sys; sys.path.insert(0, {here!r}); import bench_planner as b; "
                f"print(json.dumps(b.scale_case({tables}, {world}, {max_rows}, {dim})))")
        try:
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=args.case_timeout, env=dict(os.environ), check=False)
            last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            row = json.loads(last) if done.returncode == 0 and last else {
                "error": done.stderr.strip().splitlines()[-1:] or ["no output"]}
        except subprocess.TimeoutExpired:
            row = {"error": [f"over {args.case_timeout:.0f} s"]}
        row.update(case=name, tables=tables, world_size=world)
        rows.append(row)
        print(_format_scale(row), flush=True)
    # 26 tables on 64 ranks, in this process (the CLI's start-up stated apart)
    small = criteo_1tb(128)
    topo = Topology.preset("h100", 64, 8)
    EmbeddingShardingPlanner(topo, 512).plan(small)  # warm the imports and caches
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = EmbeddingShardingPlanner(topo, 512).plan(small)
        times.append(time.perf_counter() - start)
    row = {"case": "criteo-1tb, in process", "tables": 26, "world_size": 64,
           "seconds": statistics.median(times), "spread": [min(times), max(times)],
           "step_ms": result.step_time * 1e3, "fits": True, "batch_per_rank": 512}
    rows.append(row)
    print(_format_scale(row), flush=True)
    write_json_atomic(args.out, {"scale": True, "global_batch": GLOBAL_BATCH, "rows": rows})
    print(f"results in {args.out}")
    if args.json:
        write_result(args.json, "planner", "Planner at production scale",
                     "ctrctl plan's search alone, one fresh process per case: rows "
                     "log-uniform in 10^2..10^6 (the set that does not fit: up to 10^9 rows at dim 512), dim 64, 80 GB "
                     "HBM, 8 ranks per host, a global batch of 16,384; planning seconds (wall, "
                     "and the process's own CPU time, which the machine's load does not "
                     "inflate), the process's peak RSS (interpreter and imports included) and the plan's "
                     "estimated step (the slowest rank plus the collectives' overhead).",
                     ["case", "batch/rank", "plan s", "CPU s", "peak RSS", "estimated step"],
                     [{"values": _scale_values(r)} for r in rows], load_before)
    return 0


def _scale_values(row: dict[str, Any]) -> dict[str, str]:
    if "error" in row:
        return {"case": row["case"], "plan s": str(row["error"][0])[:60]}
    seconds = f"{row['seconds']:.2f}"
    if "spread" in row:
        seconds += f" ({row['spread'][0]:.2f}-{row['spread'][1]:.2f})"
    return {"case": row["case"], "batch/rank": f"{row.get('batch_per_rank', '')}",
            "plan s": seconds,
            "CPU s": f"{row['cpu_seconds']:.2f}" if "cpu_seconds" in row else "-",
            "peak RSS": f"{row['peak_rss_mib']:,.0f} MiB" if "peak_rss_mib" in row else "-",
            "estimated step": (f"{row['step_ms']:.3f} ms" if row.get("fits")
                               else "refused: " + row.get("message", "")[:70])}


def _format_scale(row: dict[str, Any]) -> str:
    values = _scale_values(row)
    return "  ".join(f"{k}={v}" for k, v in values.items())


def cases(quick: bool) -> list[tuple[str, list[TableSpec], int, int]]:
    """(name, tables, world size, ranks per host)."""
    if quick:
        return [
            ("uniform-26", uniform(26, 1_000_000), 8, 8),
            ("criteo-1tb", criteo_1tb(), 8, 8),
            ("skewed-40", skewed(40), 8, 8),
            ("huge+small", few_huge_many_small(30, 4), 8, 8),
            ("scale-1000x4096", random_tables(1000), 4096, 8),
        ]
    return [
        ("uniform-26", uniform(26, 1_000_000), 8, 8),
        ("uniform-26", uniform(26, 1_000_000), 64, 8),
        ("criteo-1tb", criteo_1tb(), 8, 8),
        ("criteo-1tb", criteo_1tb(), 64, 8),
        ("criteo-1tb", criteo_1tb(), 512, 8),
        ("skewed-40", skewed(40), 8, 8),
        ("skewed-40", skewed(40), 16, 8),
        ("skewed-40", skewed(40), 64, 8),
        ("skewed-80", skewed(80, seed=3), 32, 8),
        ("huge+small", few_huge_many_small(100, 4), 8, 8),
        ("huge+small", few_huge_many_small(100, 4), 64, 8),
        ("scale-1000x4096", random_tables(1000), 4096, 8),
    ]


# ---- TorchRec, in a child process --------------------------------------------------------
def _torchrec_plan(tables: list[dict[str, Any]], world: int, local: int, batch: int,
                   topo: dict[str, Any], queue: Any) -> None:
    try:
        import logging
        import warnings

        logging.getLogger("torchrec").setLevel(logging.ERROR)  # its dry-run notices
        warnings.filterwarnings("ignore")
        import torch
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner as TRPlanner
        from torchrec.distributed.planner import ParameterConstraints
        from torchrec.distributed.planner import Topology as TRTopology
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=t["name"], embedding_dim=t["dim"],
                                       num_embeddings=t["rows"], feature_names=[t["name"]])
                    for t in tables], device=torch.device("meta"))
        per_ms = 1000.0  # TorchRec's bandwidths are bytes per millisecond
        topology = TRTopology(
            world_size=world, compute_device="cuda", local_world_size=local,
            hbm_cap=int(topo["hbm_bytes"]), ddr_cap=int(topo["ddr_bytes"]),
            hbm_mem_bw=topo["hbm_bw"] / per_ms, ddr_mem_bw=topo["ddr_bw"] / per_ms,
            hbm_to_ddr_mem_bw=topo["hbm_to_ddr_bw"] / per_ms,
            intra_host_bw=topo["intra_host_bw"] / per_ms,
            inter_host_bw=topo["inter_host_bw"] / per_ms)
        constraints = {t["name"]: ParameterConstraints(pooling_factors=[t["pooling"]])
                       for t in tables}
        planner = TRPlanner(topology=topology, batch_size=batch, constraints=constraints)
        sharder = EmbeddingBagCollectionSharder(
            fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD})
        start = time.perf_counter()
        plan = planner.plan(ebc, [sharder])
        seconds = time.perf_counter() - start
        out: dict[str, Any] = {}
        for module_plan in plan.plan.values():
            for name, ps in module_plan.items():  # type: ignore[attr-defined]
                shards = []
                if ps.sharding_spec is not None:
                    for s in ps.sharding_spec.shards:
                        rank = s.placement.rank()
                        shards.append((rank, *s.shard_offsets, *s.shard_sizes))
                out[name] = {"sharding_type": ps.sharding_type,
                             "compute_kernel": ps.compute_kernel, "ranks": ps.ranks,
                             "shards": shards}
        queue.put(("ok", out, seconds))
    except Exception as exc:  # reported in the table, not raised
        queue.put(("error", f"{type(exc).__name__}: {str(exc)[:300]}", 0.0))


def torchrec_plan(tables: list[TableSpec], topology: Topology, batch: int, timeout: float
                  ) -> tuple[ShardingPlan | None, float, str]:
    """TorchRec's plan as a ctrctl ShardingPlan, its planning seconds, and a note."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    payload = [{"name": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim,
                "pooling": t.pooling_factor} for t in tables]
    proc = context.Process(target=_torchrec_plan, args=(
        payload, topology.world_size, topology.local_world_size, batch, topology.to_dict(),
        queue))
    start = time.perf_counter()
    proc.start()
    try:
        status, value, seconds = queue.get(timeout=timeout)
    except Exception:
        proc.kill()
        proc.join()
        return None, time.perf_counter() - start, f"no plan in {timeout:.0f} s"
    proc.join()
    if status != "ok":
        return None, seconds, value
    by_name = {t.name: t for t in tables}
    converted = {}
    for name, entry in value.items():
        t = by_name[name]
        if entry["shards"]:
            # TorchRec lists empty row blocks (tables with fewer rows than ranks): drop them.
            shards = tuple(ShardMetadata(rank=r, row_offset=ro, col_offset=co, rows=nr, cols=nc)
                           for r, ro, co, nr, nc in entry["shards"] if nr > 0 and nc > 0)
        else:  # data_parallel: a replica on every rank
            shards = tuple(ShardMetadata(rank=r, row_offset=0, col_offset=0,
                                         rows=t.num_embeddings, cols=t.embedding_dim)
                           for r in (entry["ranks"] or range(topology.world_size)))
        converted[name] = ParameterSharding(
            sharding_type=entry["sharding_type"], compute_kernel=entry["compute_kernel"],
            num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim, shards=shards)
    plan = ShardingPlan(world_size=topology.world_size,
                        local_world_size=topology.local_world_size, tables=converted)
    return plan, seconds, ""


# ---- the run ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scale:
        return run_scale(args)
    timeout = args.torchrec_timeout or (20.0 if args.quick else 120.0)
    try:
        import torchrec  # noqa: F401
        have_torchrec = not args.no_torchrec
    except ImportError:
        have_torchrec = False
        print("torchrec is not installed: `make bench-setup` installs it; ctrctl only",
              file=sys.stderr)
    rows = []
    for name, tables, world, local in cases(args.quick):
        topo = Topology.preset("torchrec", world, local)
        seconds, result = [], None
        for _ in range(1 if world >= 1024 else args.repeats):
            start = time.perf_counter()
            result = EmbeddingShardingPlanner(topo, args.batch_size).plan(tables)
            seconds.append(time.perf_counter() - start)
        assert result is not None
        row: dict[str, Any] = {
            "case": name, "tables": len(tables), "world_size": world,
            "ctrctl_ms": result.step_time * 1e3, "ctrctl_plan_s": statistics.median(seconds),
            "ctrctl_imbalance": result.imbalance,
            "torchrec_ms": None, "ratio": None, "torchrec_plan_s": None, "note": "",
        }
        if have_torchrec:
            plan, tr_seconds, note = torchrec_plan(tables, topo, args.batch_size, timeout)
            row["torchrec_plan_s"] = tr_seconds
            row["note"] = note
            if plan is not None:
                try:
                    rated = rate_plan(plan, tables, topo, args.batch_size)
                except PlanError as exc:  # a plan our format cannot express: say so
                    row["note"] = f"not comparable: {exc.message[:80]}"
                else:
                    row["torchrec_ms"] = rated.step_time * 1e3
                    row["ratio"] = result.step_time / rated.step_time
        rows.append(row)
        print(_format_row(row), flush=True)
    compared = [r for r in rows if r["ratio"] is not None]
    never_worse = all(r["ratio"] <= 1 + 1e-9 for r in compared)
    skewed = [r["ratio"] for r in compared if not r["case"].startswith("uniform")]
    summary = {"compared": len(compared), "never_worse": never_worse,
               "best_ratio": min((r["ratio"] for r in compared), default=None),
               "median_ratio_nonuniform": statistics.median(skewed) if skewed else None}
    print(f"compared {summary['compared']} cases: never worse than TorchRec: {never_worse}; "
          f"median ratio on non-uniform sets {summary['median_ratio_nonuniform']}")
    write_json_atomic(args.out, {"batch_size": args.batch_size, "quick": args.quick,
                                 "summary": summary, "rows": rows})
    print(f"results in {args.out}")
    return 0


def _format_row(row: dict[str, Any]) -> str:
    def num(value: Any, fmt: str) -> str:
        return format(value, fmt) if value is not None else "-"

    return (f"{row['case']:<18} W={row['world_size']:<5} ctrctl {num(row['ctrctl_ms'], '9.3f')} ms "
            f"torchrec {num(row['torchrec_ms'], '9.3f')} ms ratio {num(row['ratio'], '6.3f')} "
            f"plan {num(row['ctrctl_plan_s'], '6.2f')} s vs {num(row['torchrec_plan_s'], '6.1f')} s"
            f" {row['note']}")


if __name__ == "__main__":
    sys.exit(main())
