"""Does the planner's estimate mean something? Measure plans on gloo and compare.

For a handful of plans at world size 2 (the planner's own and one per forced sharding type),
run the sharded embedding part (``ShardedEmbeddingBagCollection`` forward, backward with the
fused update, and the data-parallel gradient all-reduce) on two local processes, and compare
the measured step time with the plan's estimate from a calibrated topology: the ranking of
the plans should agree, and each estimate should be within 30% of its measurement.

    .venv/bin/python scripts/check_plan_estimates.py                     # calibrates first
    .venv/bin/python scripts/check_plan_estimates.py --topology topology.json --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ctrctl.distributed.planner import (
    EmbeddingShardingPlanner,
    TableConstraints,
    TableSpec,
    Topology,
    rate_plan,
)
from ctrctl.distributed.planner.measure import measure_step_body, table_payload
from ctrctl.distributed.types import ShardingPlan

#: The planner's plan, one plan per forced type, and every table on rank 0 ("lopsided").
PLAN_TYPES = ("planner", "table_wise", "lopsided", "row_wise", "column_wise",
              "table_column_wise", "data_parallel")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topology", type=Path, default=None,
                        help="a calibrated topology.json (default: calibrate now)")
    parser.add_argument("--quick", action="store_true", help="fewer steps, smaller tables")
    parser.add_argument("--batch-size", type=int, default=None, help="per rank")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per plan")
    parser.add_argument("--out", type=Path, default=Path("bench-out/plan_estimates.json"))
    return parser.parse_args(argv)


def check_tables(quick: bool) -> list[TableSpec]:
    """Tables with different sizes, dims and pooling so the plans differ in cost."""
    scale = 1 if quick else 2
    return [
        TableSpec("big_pooled", 100_000 * scale, 64, pooling_factor=8.0),
        TableSpec("wide", 50_000 * scale, 128, pooling_factor=2.0),
        TableSpec("narrow_a", 20_000 * scale, 32, pooling_factor=1.0),
        TableSpec("narrow_b", 10_000 * scale, 32, pooling_factor=4.0),
        TableSpec("mid", 40_000 * scale, 64, pooling_factor=1.0),
        TableSpec("tiny", 500, 64, pooling_factor=1.0),
    ]


def make_plans(tables: list[TableSpec], topology: Topology, batch: int
               ) -> dict[str, ShardingPlan]:
    plans = {}
    for kind in PLAN_TYPES:
        chosen = tables
        forced: tuple[str, ...] | None = (kind,)
        if kind == "planner":
            forced = None
        elif kind == "lopsided":
            forced = ("table_wise",)
            chosen = [dataclasses.replace(t, constraints=TableConstraints(ranks=(0,)))
                      for t in tables]
        plans[kind] = EmbeddingShardingPlanner(topology, batch, forced).plan(chosen).plan
    return plans


def spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation of two lists (no ties expected)."""
    def ranks(values: list[float]) -> list[int]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0] * len(values)
        for r, i in enumerate(order):
            out[i] = r
        return out

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    d2 = sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True))
    return 1 - 6 * d2 / (n * (n * n - 1)) if n > 1 else 1.0


def check(topology: Topology, quick: bool = False, batch: int | None = None,
          steps: int | None = None) -> dict[str, Any]:
    """Measure every plan; return rows (estimate, measured, error) and the rank agreement."""
    from ctrctl.testing.multiprocess import run_multiprocess

    batch = batch or (1024 if quick else 2048)
    steps = steps or (8 if quick else 20)
    tables = check_tables(quick)
    topology = topology.with_world(2, 2)
    payload = table_payload(tables)
    rows = []
    for name, plan in make_plans(tables, topology, batch).items():
        estimate = rate_plan(plan, tables, topology, batch).step_time
        measured = max(run_multiprocess(measure_step_body, 2, args=(
            payload, plan.to_dict(), batch, steps), timeout_s=300))
        rows.append({"plan": name, "estimate_ms": estimate * 1e3, "measured_ms": measured * 1e3,
                     "error": estimate / measured - 1})
        print(f"{name:<18} estimate {estimate * 1e3:8.2f} ms  measured {measured * 1e3:8.2f} ms"
              f"  error {100 * (estimate / measured - 1):+6.1f}%", flush=True)
    rho = spearman([r["estimate_ms"] for r in rows], [r["measured_ms"] for r in rows])
    return {"rows": rows, "spearman": rho, "batch_per_rank": batch,
            "max_abs_error": max(abs(r["error"]) for r in rows)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.topology is not None:
        topology = Topology.load(args.topology, world_size=2, local_world_size=2)
    else:
        from ctrctl.distributed.planner.calibration import calibrate

        topology = calibrate(None, quick=args.quick)
    result = check(topology, args.quick, args.batch_size, args.steps)
    print(f"rank correlation of estimates and measurements: {result['spearman']:.3f}; "
          f"largest error {100 * result['max_abs_error']:.1f}%")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
