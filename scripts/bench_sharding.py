"""Training throughput of each sharding type on 2 gloo ranks: ctrctl vs TorchRec 1.8.0.

The model is FACTS.md's DLRM: 26 tables x 100,000 rows x dim 64, 13 dense features, dense
arch 512,256,64, over arch 512,256,1, one id per feature, fused exact rowwise Adagrad for the
tables and Adagrad for the dense part, B samples per rank (global batch 2B). Each
implementation and type runs in its own pair of processes (gloo, 1 thread each); every step
gets a fresh random batch; the figure is the global batch over the median step time of the
timed steps, after warm-up. With ``--repeats``, runs alternate between the implementations;
reported are the median over repeats, the spread (min-max) and the ratio of each repeat's
pair (ctrctl's run and the TorchRec run right after it), with the load average. TorchRec runs each type through a sharder that offers every type on
CPU (its planner alone allows only DP/TW/CW/TWCW there).

Usage:
    python scripts/bench_sharding.py [--quick] [--types table_wise,row_wise] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from render_performance import add_json_argument, load_average, write_result

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.io import write_json_atomic

TYPES = ["table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise",
         "data_parallel"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model, a few steps")
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated types")
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4096, help="samples per rank")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--no-torchrec", action="store_true", help="ctrctl only")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per implementation, interleaved (a shared machine's load "
                             "changes from minute to minute): medians and spreads reported")
    parser.add_argument("--out", type=Path, default=Path("bench-out/sharding.json"))
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.tables, args.rows, args.dim, args.batch_size = 4, 2_000, 16, 256
        args.steps, args.warmup = 6, 2
    return args


def _arch(dim: int, quick: bool) -> tuple[list[int], list[int]]:
    return ([32, dim], [32, 1]) if quick else ([512, 256, dim], [512, 256, 1])


def _batches(cfg: dict[str, Any], rank: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    """(dense (B, 13), ids (T*B,), labels (B,)) per step, different on every rank."""
    gen = torch.Generator().manual_seed(1000 * rank + 7)
    batch, tables = cfg["batch_size"], cfg["tables"]
    return [(torch.rand(batch, 13, generator=gen),
             torch.randint(0, cfg["rows"], (tables * batch,), generator=gen),
             torch.randint(0, 2, (batch,), generator=gen).float()) for _ in range(count)]


def _time_steps(step: Any, batches: list[tuple[torch.Tensor, ...]], warmup: int) -> list[float]:
    times = []
    for i, batch in enumerate(batches):
        dist.barrier()
        start = time.perf_counter()
        step(*batch)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def ctrctl_body(rank: int, world_size: int, cfg: dict[str, Any], kind: str) -> list[float]:
    from ctrctl.distributed.default_plan import forced_plan
    from ctrctl.distributed.model_parallel import DistributedModelParallel
    from ctrctl.modules.dlrm import DLRM
    from ctrctl.modules.embedding_configs import EmbeddingBagConfig
    from ctrctl.modules.embedding_modules import EmbeddingBagCollection
    from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
    from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor

    keys = [f"f{i}" for i in range(cfg["tables"])]
    tables = [EmbeddingBagConfig(f"t{i}", cfg["rows"], cfg["dim"], [keys[i]])
              for i in range(cfg["tables"])]
    ebc = EmbeddingBagCollection(tables, EmbeddingOptimizerConfig(lr=0.01), seed=0)
    dense_arch, over_arch = _arch(cfg["dim"], cfg["quick"])
    model = DLRM(ebc, 13, dense_arch, over_arch)
    plan = forced_plan(tables, world_size, kind, min_block_width=max(4, cfg["dim"] // 2))
    dmp = DistributedModelParallel(model, plan)
    opt = torch.optim.Adagrad(list(dmp.dense_parameters()), lr=0.01)
    lengths = torch.ones(cfg["tables"] * cfg["batch_size"], dtype=torch.long)

    def step(dense: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor) -> None:
        kjt = KeyedJaggedTensor(keys, ids, lengths=lengths, stride=cfg["batch_size"])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(dense, kjt), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return _time_steps(step, _batches(cfg, rank, cfg["warmup"] + cfg["steps"]), cfg["warmup"])


def torchrec_sharded(model: Any, tables: list[Any], kind: str, cfg: dict[str, Any],
                     world_size: int) -> tuple[Any, torch.optim.Optimizer]:
    """TorchRec's DistributedModelParallel of ``model`` with every table sharded ``kind``
    (fused exact row-wise Adagrad, lr 0.01, through a sharder that offers every type on CPU),
    and Adagrad on the dense parameters. Also used by scripts/bench_pipeline.py."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    class AllTypesSharder(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type: str) -> list[str]:
            return list(TYPES)

    sharder = AllTypesSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                            "learning_rate": 0.01})
    kernel = "dense" if kind == "data_parallel" else "fused"
    constraints = {t.name: ParameterConstraints(sharding_types=[kind], compute_kernels=[kernel],
                                                min_partition=max(4, cfg["dim"] // 2))
                   for t in tables}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device="cpu"),
        constraints=constraints, batch_size=cfg["batch_size"])
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                   sharders=[sharder])
    dense = [p for _, p in in_backward_optimizer_filter(dmp.named_parameters())]
    return dmp, torch.optim.Adagrad(dense, lr=0.01)


def torchrec_body(rank: int, world_size: int, cfg: dict[str, Any], kind: str) -> list[float]:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.models.dlrm import DLRM

    keys = [f"f{i}" for i in range(cfg["tables"])]
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=cfg["rows"],
                                 embedding_dim=cfg["dim"], feature_names=[keys[i]])
              for i in range(cfg["tables"])]
    dense_arch, over_arch = _arch(cfg["dim"], cfg["quick"])
    model = DLRM(EmbeddingBagCollection(tables=tables, device=torch.device("meta")), 13,
                 dense_arch, over_arch)
    dmp, opt = torchrec_sharded(model, tables, kind, cfg, world_size)
    lengths = torch.ones(cfg["tables"] * cfg["batch_size"], dtype=torch.int64)

    def step(dense_x: torch.Tensor, ids: torch.Tensor, labels: torch.Tensor) -> None:
        kjt = KeyedJaggedTensor(keys=keys, values=ids, lengths=lengths)
        logits = dmp(dense_x, kjt).squeeze(1)
        torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).backward()
        opt.step()
        opt.zero_grad()

    return _time_steps(step, _batches(cfg, rank, cfg["warmup"] + cfg["steps"]), cfg["warmup"])


def measure(impl: str, kind: str, cfg: dict[str, Any], world_size: int) -> dict[str, Any]:
    body = ctrctl_body if impl == "ctrctl" else torchrec_body
    try:
        per_rank = run_multiprocess(body, world_size, args=(cfg, kind), timeout_s=600)
    except AssertionError as exc:
        return {"error": str(exc).strip().splitlines()[-1][:300]}
    # a step ends when its slowest rank does
    steps = [max(ts) for ts in zip(*per_rank, strict=True)]
    median = statistics.median(steps)
    return {"median_step_s": median,
            "samples_per_s": cfg["batch_size"] * world_size / median,
            "steps": len(steps)}


def result_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The run as rows of the performance table (render_performance.py's format)."""
    rows = []
    for kind, row in results["types"].items():
        rates = " / ".join(f"{row[n]['samples_per_s']:,.0f}" if "samples_per_s" in row.get(n, {})
                           else "-" for n in ("ctrctl", "torchrec"))
        ratio = (f"{row['ratio']:.2f}x [{row['ratio_spread'][0]:.2f}-{row['ratio_spread'][1]:.2f}]"
                 if row["ratio"] else "not run")
        rows.append({"values": {"case": kind, "samples/s ctrctl / TorchRec": rates,
                                "ctrctl / TorchRec": ratio},
                     "headline": {"label": f"Sharding, {kind}, 2 ranks, vs TorchRec",
                                  "column": "ctrctl / TorchRec"}})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = load_average()
    cfg = {"tables": args.tables, "rows": args.rows, "dim": args.dim,
           "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup,
           "quick": args.quick}
    impls = ["ctrctl"] + ([] if args.no_torchrec else ["torchrec"])
    if "torchrec" in impls:
        try:
            import torchrec  # noqa: F401
        except ImportError:
            print("torchrec is not installed (make bench-setup): measuring ctrctl only")
            impls = ["ctrctl"]
    results: dict[str, Any] = {"config": {**cfg, "world_size": args.world_size}, "types": {}}
    print(f"{'type':<20}{'ctrctl samples/s':>18}{'torchrec samples/s':>20}{'ratio':>8}"
          f"   (medians of {args.repeats} repeats)")
    for kind in [t for t in args.types.split(",") if t]:
        runs: dict[str, list[dict[str, Any]]] = {impl: [] for impl in impls}
        for _ in range(args.repeats):
            for impl in impls:
                runs[impl].append(measure(impl, kind, cfg, args.world_size))
        row: dict[str, Any] = {}
        for impl, rs in runs.items():
            rates = [r["samples_per_s"] for r in rs if "samples_per_s" in r]
            row[impl] = ({"samples_per_s": statistics.median(rates), "min": min(rates),
                          "max": max(rates), "all_samples_per_s": rates} if rates
                         else {"error": next((r["error"] for r in rs if "error" in r), "-")})
        pairs = [a["samples_per_s"] / b["samples_per_s"]
                 for a, b in zip(runs["ctrctl"], runs.get("torchrec", []), strict=False)
                 if "samples_per_s" in a and "samples_per_s" in b]
        mine = row["ctrctl"].get("samples_per_s")
        ref = row.get("torchrec", {}).get("samples_per_s")
        row["ratio"] = statistics.median(pairs) if pairs else None
        row["ratio_spread"] = [min(pairs), max(pairs)] if pairs else None
        row["loadavg"] = Path("/proc/loadavg").read_text().strip()
        results["types"][kind] = row
        cells = [f"{mine:,.0f}" if mine else row["ctrctl"].get("error", "-")[:16],
                 f"{ref:,.0f}" if ref else (row.get("torchrec", {}).get("error", "-")[:18]),
                 f"{row['ratio']:.2f}" if row["ratio"] else "-"]
        if row["ratio_spread"]:
            cells[2] += f" [{row['ratio_spread'][0]:.2f}-{row['ratio_spread'][1]:.2f}]"
        print(f"{kind:<20}{cells[0]:>18}{cells[1]:>20}  {cells[2]:<18} load {row['loadavg']}",
              flush=True)
    write_json_atomic(args.out, results)
    print(f"results: {args.out}")
    if args.json:
        write_result(
            args.json, "sharding", "Sharding: 2 gloo processes on CPU (`scripts/bench_sharding.py`)",
            f"The training benchmark's DLRM ({cfg['tables']} tables x {cfg['rows']:,} x "
            f"{cfg['dim']}), {cfg['batch_size']} samples per rank, 1 thread per rank, "
            f"{args.world_size} ranks, the same plan for ctrctl and TorchRec 1.8.0's "
            "DistributedModelParallel; runs alternate, median over repeats [min-max of the "
            "per-pair ratio].",
            ["case", "samples/s ctrctl / TorchRec", "ctrctl / TorchRec"], result_rows(results),
            load_before=load_before)
        print(f"performance table in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
