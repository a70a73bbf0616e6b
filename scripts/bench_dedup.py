"""Deduplicated lookups: step time and all-to-all bytes with and without dedup, 2 gloo ranks.

The model is the sharding benchmark's DLRM (26 tables, one id per feature, fused exact
rowwise Adagrad, Adagrad for the dense part) sharded table-wise (``--plan``). Each layout runs
in one pair of processes that alternates the two paths step by step (``set_dedup("off")``,
``set_dedup("on")``) on fresh batches, so the machine's changing load falls on both alike:

* ``zipf-S``: every feature's ids drawn from a Zipf law of exponent S over the table's rows
  (S = 0: uniform);
* ``user-13of26``: 13 features repeat per user, 20 impressions per user in a batch, the other
  13 uniform;
* ``share-P`` (``--sweep``): every feature holds exactly P x B distinct ids, to find the
  distinct-bag share below which dedup pays (``dedup: auto``'s threshold).

All-to-all bytes are the bytes each rank sends to the other rank in every
``all_to_all_single`` of a step (input dist, pooled output, and their backward), counted by
wrapping the collective. Reported per layout: the median step time each way, the speed-up
(median over repeats of the per-run ratio of medians, [min-max]), the bytes and the share.

Usage:
    python scripts/bench_dedup.py [--quick] [--sweep] [--repeats 3] [--json PATH]
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

LAYOUTS = ["zipf-0", "zipf-1.05", "zipf-1.2", "user-13of26"]
SWEEP = ["share-1.0", "share-0.5", "share-0.2"]
IMPRESSIONS_PER_USER = 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model, a few steps")
    parser.add_argument("--sweep", action="store_true",
                        help="also the share-P layouts (auto's threshold)")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated")
    parser.add_argument("--models", default="dlrm,ebc",
                        help="dlrm (the whole training step) and/or ebc (the sharded "
                             "collection's forward and backward alone); the sweep runs on ebc")
    parser.add_argument("--plan", default="table_wise", help="the sharding type of every table")
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2048, help="samples per rank")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per path")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per path")
    parser.add_argument("--repeats", type=int, default=2, help="process pairs per layout")
    parser.add_argument("--out", type=Path, default=Path("bench-out/dedup.json"))
    add_json_argument(parser)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.layouts.split(",")) - set(LAYOUTS) - set(SWEEP))
    if unknown:
        parser.error(f"--layouts: unknown {', '.join(unknown)}; "
                     f"choose from {', '.join(LAYOUTS + SWEEP)}")
    if args.quick:
        args.tables, args.rows, args.dim, args.batch_size = 4, 2_000, 16, 200
        args.steps, args.warmup, args.repeats = 3, 1, 1
    return args


def feature_ids(layout: str, feature: int, cfg: dict[str, Any], gen: torch.Generator
                ) -> torch.Tensor:
    """(B,) ids of one feature in one batch of ``layout``."""
    batch, rows = cfg["batch_size"], cfg["rows"]
    kind, _, arg = layout.partition("-")
    if kind == "zipf":
        exponent = float(arg)
        probs = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** exponent
        ranks = torch.multinomial(probs, batch, replacement=True, generator=gen)
        spread = torch.randperm(rows, generator=torch.Generator().manual_seed(feature))
        return spread[ranks]      # hot ids spread over the rows, not all at the top
    if kind == "user":
        repeated = int(arg.split("of")[0])
        if feature < repeated:
            users = torch.randint(0, rows, (-(-batch // IMPRESSIONS_PER_USER),),
                                  generator=gen)
            return users.repeat_interleave(IMPRESSIONS_PER_USER)[:batch].roll(
                int(torch.randint(0, batch, (1,), generator=gen)))
        return torch.randint(0, rows, (batch,), generator=gen)
    if kind == "share":
        distinct = max(1, round(float(arg) * batch))
        pool = torch.randperm(rows, generator=gen)[:distinct]
        return pool[torch.randperm(batch, generator=gen) % distinct]
    raise SystemExit(f"unknown layout {layout!r}")


class _Counter:
    """Wraps ``dist.all_to_all_single``: bytes this rank sends to the others."""

    def __init__(self) -> None:
        self.bytes = 0
        self._inner = dist.all_to_all_single
        dist.all_to_all_single = self  # type: ignore[assignment]

    def __call__(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                 output_split_sizes: list[int] | None = None,
                 input_split_sizes: list[int] | None = None, **kw: Any) -> Any:
        me, world = dist.get_rank(kw.get("group")), dist.get_world_size(kw.get("group"))
        splits = input_split_sizes or [input.numel() // world] * world
        self.bytes += (sum(splits) - splits[me]) * input.element_size()
        return self._inner(output, input, output_split_sizes, input_split_sizes, **kw)


def body(rank: int, world_size: int, cfg: dict[str, Any], model: str, layout: str
         ) -> dict[str, Any]:
    from ctrctl.distributed.default_plan import forced_plan
    from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection, set_dedup
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
    arch = ([32, cfg["dim"]], [32, 1]) if cfg["quick"] else ([512, 256, cfg["dim"]],
                                                             [512, 256, 1])
    plan = forced_plan(tables, world_size, cfg["plan"])
    if model == "ebc":         # the embedding stage alone: sharded EBC forward + backward
        dmp: torch.nn.Module = DistributedModelParallel(ebc, plan)
        params: list[torch.nn.Parameter] = []
    else:
        dmp = DistributedModelParallel(DLRM(ebc, 13, *arch), plan)
        params = list(dmp.dense_parameters())  # type: ignore[operator]
    sebc = next(m for m in dmp.modules() if isinstance(m, ShardedEmbeddingBagCollection))
    opt = torch.optim.Adagrad(params or [torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    counter = _Counter()
    gen = torch.Generator().manual_seed(1000 * rank + 7)
    batch = cfg["batch_size"]
    lengths = torch.ones(cfg["tables"] * batch, dtype=torch.long)
    times: dict[str, list[float]] = {"off": [], "on": []}
    sent: dict[str, list[int]] = {"off": [], "on": []}
    shares = []
    for i in range(cfg["warmup"] + cfg["steps"]):
        for mode in ("off", "on"):
            ids = torch.cat([feature_ids(layout, f, cfg, gen) for f in range(cfg["tables"])])
            kjt = KeyedJaggedTensor(keys, ids, lengths=lengths, stride=batch)
            dense = torch.rand(batch, 13, generator=gen)
            labels = torch.randint(0, 2, (batch,), generator=gen).float()
            set_dedup(dmp, mode)
            dist.barrier()
            counter.bytes = 0
            start = time.perf_counter()
            if model == "ebc":
                dmp(kjt).values().sum().backward()
            else:
                logits = dmp(dense, kjt)
                torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).backward()
            opt.step()
            opt.zero_grad()
            if i >= cfg["warmup"]:
                times[mode].append(time.perf_counter() - start)
                sent[mode].append(counter.bytes)
                if mode == "on":
                    shares.append(float(sebc.last_distinct_share or 1.0))
    return {"times": times, "bytes": sent, "share": statistics.mean(shares)}


def measure(model: str, layout: str, cfg: dict[str, Any], world_size: int) -> dict[str, Any]:
    per_rank = run_multiprocess(body, world_size, args=(cfg, model, layout), timeout_s=600)
    out: dict[str, Any] = {"share": statistics.mean(r["share"] for r in per_rank)}
    for mode in ("off", "on"):
        # a step ends when its slowest rank does
        steps = [max(ts) for ts in zip(*(r["times"][mode] for r in per_rank), strict=True)]
        out[f"step_s_{mode}"] = statistics.median(steps)
        out[f"bytes_{mode}"] = statistics.median(
            sum(bs) for bs in zip(*(r["bytes"][mode] for r in per_rank), strict=True)) / world_size
    out["speedup"] = out["step_s_off"] / out["step_s_on"]
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["speedup"] for r in runs]
    return {"share": statistics.median(r["share"] for r in runs),
            "step_ms_off": 1000 * statistics.median(r["step_s_off"] for r in runs),
            "step_ms_on": 1000 * statistics.median(r["step_s_on"] for r in runs),
            "mb_off": statistics.median(r["bytes_off"] for r in runs) / 1e6,
            "mb_on": statistics.median(r["bytes_on"] for r in runs) / 1e6,
            "speedup": statistics.median(ratios), "spread": [min(ratios), max(ratios)],
            "runs": runs, "loadavg": Path("/proc/loadavg").read_text().strip()}


def result_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for layout, row in results["layouts"].items():
        rows.append({"values": {
            "case": layout, "bags sent / all bags": f"{row['share']:.2f}",
            "step ms off / on": f"{row['step_ms_off']:.0f} / {row['step_ms_on']:.0f}",
            "speed-up": f"{row['speedup']:.2f}x [{row['spread'][0]:.2f}-{row['spread'][1]:.2f}]",
            "all-to-all MB/rank/step off / on": f"{row['mb_off']:.2f} / {row['mb_on']:.2f}"}})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = load_average()
    cfg = {"tables": args.tables, "rows": args.rows, "dim": args.dim, "plan": args.plan,
           "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup,
           "quick": args.quick}
    models = [m for m in args.models.split(",") if m]
    cases = [(m, x) for m in models for x in args.layouts.split(",") if x]
    cases += [("ebc", x) for x in SWEEP] if args.sweep else []
    results: dict[str, Any] = {"config": {**cfg, "world_size": 2, "repeats": args.repeats},
                               "layouts": {}}
    print(f"{'case':<18}{'share':>7}{'off ms':>9}{'on ms':>8}{'speed-up':>20}"
          f"{'MB off':>9}{'MB on':>8}")
    for model, layout in cases:
        row = summarise([measure(model, layout, cfg, 2) for _ in range(args.repeats)])
        name = f"{model} {layout}"
        results["layouts"][name] = row
        print(f"{name:<18}{row['share']:>7.2f}{row['step_ms_off']:>9.1f}{row['step_ms_on']:>8.1f}"
              f"{row['speedup']:>9.2f} [{row['spread'][0]:.2f}-{row['spread'][1]:.2f}]"
              f"{row['mb_off']:>9.2f}{row['mb_on']:>8.2f}  load {row['loadavg']}", flush=True)
    write_json_atomic(args.out, results)
    print(f"results: {args.out}")
    if args.json:
        write_result(
            args.json, "dedup", "Deduplicated lookups: 2 gloo processes (`scripts/bench_dedup.py`)",
            f"DLRM, {cfg['tables']} tables x {cfg['rows']:,} x {cfg['dim']} {cfg['plan']}, "
            f"{cfg['batch_size']} samples per rank, one id per feature, 1 thread per rank; the "
            "two paths alternate step by step in one process pair; median step over "
            f"{cfg['steps']} steps each way, speed-up: median over {args.repeats} process "
            "pairs [min-max]; all-to-all bytes: sent to the other rank per step, forward and "
            "backward.",
            ["case", "bags sent / all bags", "step ms off / on", "speed-up",
             "all-to-all MB/rank/step off / on"], result_rows(results),
            load_before=load_before)
        print(f"performance table in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
