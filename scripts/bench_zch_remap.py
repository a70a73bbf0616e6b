"""The managed-collision remap per id, against the embedding lookup it precedes.

For each capacity: a warm remapper (filled by earlier steps of the same stream) remaps one
training step's ids (Zipf over ``--universe`` raw keys, so ids are admitted and evicted every
step), and, read-only, a serving batch; the lookup is the forward of one pooled table of
``capacity`` rows x ``--dim`` on the same slots (the native/FBGEMM kernel the
EmbeddingBagCollection picks). Times are per id: the median over ``--repeats`` runs of the
median of ``--steps`` steps, and the spread (min-max) over runs. ``--shards 1,8`` measures
the remapper whole and split into 8 parts held by one process (the cost of routing keys to
their parts; each part admits and evicts on its own).

``--ranks 2`` also measures the ranks' exchange of a step's keys: ``--ranks`` gloo processes
each hold the parts (``--exchange-shards``) of their row-wise block of the table and remap a
training step of ``--batch`` ids split evenly over them, through the collection's forward
(keys exchanged, remapped, slots returned, reassigned rows reset in a ``--dim`` table), once
with each exchange (``all_gather``: every key to every rank and a sum of the slots;
``all_to_all``: each key to its part's rank alone). Per step: the slowest rank's time, the
ranks' CPU time summed (their threads, gloo's included: less sensitive to a loaded machine
than the wall time), and the bytes a rank sends to the others (all-gather: the tensor to
each other rank; all-reduce: a ring's ``2 (W-1)/W`` of it; all-to-all: what goes to the
other ranks), counted at the collectives the collection calls.

Usage:
    python scripts/bench_zch_remap.py [--capacities 10000,100000] [--shards 1] [--batch 16384]
        [--dim 64] [--steps 9] [--repeats 3] [--threads 1] [--ranks 0] [--exchange-shards 8]
        [--exchange-only] [--out bench-out/zch_remap.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrctl.io import write_json_atomic
from ctrctl.modules import (
    CollisionConfig,
    CollisionRemapper,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
)
from ctrctl.modules.collision_shards import ShardedRemapper
from ctrctl.sparse import KeyedJaggedTensor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacities", default="10000,100000")
    p.add_argument("--shards", default="1")
    p.add_argument("--universe", type=int, default=2_000_000)
    p.add_argument("--batch", type=int, default=16_384)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ranks", type=int, default=0,
                   help="gloo processes for the exchange measurement (0: none)")
    p.add_argument("--exchange-shards", type=int, default=8)
    p.add_argument("--exchange-only", action="store_true",
                   help="skip the one-process remap and lookup figures")
    p.add_argument("--out", type=Path, default=Path("bench-out/zch_remap.json"))
    return p.parse_args(argv)


def zipf_keys(rng: np.random.Generator, n: int, universe: int) -> torch.Tensor:
    ranks = np.minimum(rng.zipf(1.1, n), universe) - 1
    # Scatter the ranks over 64 bits (an odd multiplier wraps mod 2**64: one key per rank).
    return torch.from_numpy((ranks.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
                            .view(np.int64))


def measure(capacity: int, shards: int, args: argparse.Namespace, seed: int
            ) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    config = CollisionConfig(capacity=capacity, eviction="lru", shards=shards)
    remapper: CollisionRemapper | ShardedRemapper = (
        CollisionRemapper(config) if shards == 1 else ShardedRemapper(config))
    steps = 0
    for _ in range(max(2, 4 * capacity // args.batch)):  # warm: the table full
        remapper.remap(zipf_keys(rng, args.batch, args.universe))
        steps += 1
    ebc = EmbeddingBagCollection([EmbeddingBagConfig("t", capacity, args.dim, ["f"])])
    train, serve, lookup = [], [], []
    for _ in range(args.steps):
        keys = zipf_keys(rng, args.batch, args.universe)
        t0 = time.perf_counter()
        slots = remapper.remap(keys)
        train.append(time.perf_counter() - t0)
        steps += 1
        remapper.remap(keys[:1], update=False)  # serving keeps one index: built before
        t0 = time.perf_counter()
        remapper.remap(keys, update=False)
        serve.append(time.perf_counter() - t0)
        kjt = KeyedJaggedTensor(["f"], slots, lengths=torch.ones(args.batch, dtype=torch.int64))
        with torch.no_grad():
            t0 = time.perf_counter()
            ebc(kjt)
            lookup.append(time.perf_counter() - t0)
    per_id = 1e9 / args.batch
    return {"remap_train_ns": statistics.median(train) * per_id,
            "remap_serve_ns": statistics.median(serve) * per_id,
            "lookup_ns": statistics.median(lookup) * per_id,
            "evictions_per_step": remapper.stats()["evictions"] / float(steps)}


def measure_exchange(capacity: int, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per exchange, the step time (ms, slowest rank) and bytes sent per rank: median and
    min-max over ``--repeats`` runs, each the median of ``--steps`` steps."""
    from ctrctl.distributed.processes import run_multiprocess

    per_rank = run_multiprocess(exchange_rank, args.ranks, args=(capacity, vars(args)),
                                timeout_s=900.0)
    runs = per_rank[0]  # every rank returns the same (maxima over ranks)
    out = {}
    for name in EXCHANGES:
        rows = runs[name]
        out[name] = {k: {"median": statistics.median(r[k] for r in rows),
                         "min": min(r[k] for r in rows), "max": max(r[k] for r in rows)}
                     for k in rows[0]}
    return out


EXCHANGES = ("all_gather", "all_to_all")


def exchange_rank(rank: int, world: int, capacity: int, options: dict[str, Any]
                  ) -> dict[str, list[dict[str, float]]]:
    """One rank of :func:`measure_exchange`: for each repeat and exchange, a fresh placed
    collection warmed on the same stream, then ``steps`` timed steps."""
    import torch.distributed as dist

    from ctrctl.modules import ManagedCollisionCollection

    args = argparse.Namespace(**options)
    torch.set_num_threads(args.threads)
    counter = _ByteCounter(world, dist.get_rank())
    tables = [EmbeddingBagConfig("t", capacity, args.dim, ["f"])]
    block = -(-capacity // world)
    blocks = {"t": [(r, r * block, min(block, capacity - r * block)) for r in range(world)]}
    share = args.batch // world
    warm = max(2, 4 * capacity // args.batch)  # untimed steps that fill the table
    out: dict[str, list[dict[str, float]]] = {name: [] for name in EXCHANGES}
    for repeat in range(args.repeats):
        for name in EXCHANGES:
            config = CollisionConfig(capacity=capacity, eviction="lru",
                                     shards=args.exchange_shards)
            mc = ManagedCollisionCollection({"t": config}, tables,
                                            process_group=dist.group.WORLD)
            mc.exchange = name  # type: ignore[assignment]
            mc.place(blocks, rank)
            ebc = EmbeddingBagCollection(tables)
            rng = np.random.default_rng(1000 * repeat)  # the same global stream everywhere
            times, cpu, sent = [], [], []
            for step in range(warm + args.steps):
                keys = zipf_keys(rng, share * world, args.universe)[rank * share:][:share]
                kjt = KeyedJaggedTensor(["f"], keys, lengths=torch.ones(share,
                                                                        dtype=torch.int64))
                dist.barrier()
                counter.start()
                t0, c0 = time.perf_counter(), time.process_time()
                mc(kjt, ebc)
                elapsed, used = time.perf_counter() - t0, time.process_time() - c0
                counter.stop()
                if step >= warm:  # the table full
                    times.append(elapsed)
                    cpu.append(used)
                    sent.append(counter.bytes)
            slowest = torch.tensor([statistics.median(times), statistics.median(sent)],
                                   dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            total_cpu = torch.tensor([statistics.median(cpu)], dtype=torch.float64)
            dist.all_reduce(total_cpu)
            out[name].append({"step_ms": float(slowest[0]) * 1e3,
                              "cpu_ms_all_ranks": float(total_cpu[0]) * 1e3,
                              "bytes_sent_per_rank": float(slowest[1])})
    return out


class _ByteCounter:
    """Counts the bytes this rank sends to the others in the collectives the collection
    calls (``all_gather``, ``all_reduce``, ``all_to_all_single``), while started."""

    def __init__(self, world: int, rank: int) -> None:
        import torch.distributed as dist

        self.world, self.rank, self.bytes, self.on = world, rank, 0, False
        for name in ("all_gather", "all_reduce", "all_to_all_single"):
            setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def start(self) -> None:
        self.bytes, self.on = 0, True

    def stop(self) -> None:
        self.on = False

    def _wrap(self, name: str, call: Any) -> Any:
        def counted(*a: Any, **kw: Any) -> Any:
            if self.on:
                self.bytes += self._sent(name, a)
            return call(*a, **kw)
        return counted

    def _sent(self, name: str, a: tuple[Any, ...]) -> int:
        w = self.world
        if name == "all_gather":  # (outputs, tensor)
            return (w - 1) * a[1].numel() * a[1].element_size()
        if name == "all_reduce":  # a ring: reduce-scatter then all-gather
            return 2 * (w - 1) * a[0].numel() * a[0].element_size() // w
        tensor = a[1]  # all_to_all_single(output, input, output_splits, input_splits)
        splits = a[3] if len(a) > 3 and a[3] is not None else [tensor.size(0) // w] * w
        row = tensor[:1].numel() * tensor.element_size() if tensor.size(0) else 0
        return (sum(splits) - splits[self.rank]) * row


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)},
                              "load_before": Path("/proc/loadavg").read_text().split()[:3]}
    cases = [] if args.exchange_only else [(int(c), int(s)) for c in args.capacities.split(",")
                                           for s in args.shards.split(",")]
    for capacity, shards in cases:
        runs = [measure(capacity, shards, args, seed) for seed in range(args.repeats)]
        row = {k: {"median": statistics.median(r[k] for r in runs),
                   "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)}
               for k in runs[0]}
        report[str(capacity) if shards == 1 else f"{capacity}/{shards}"] = row
        print(f"capacity {capacity:,}, {shards} shard(s): remap (train) "
              f"{row['remap_train_ns']['median']:.0f} "
              f"ns/id [{row['remap_train_ns']['min']:.0f}-{row['remap_train_ns']['max']:.0f}]"
              f", remap (serve) {row['remap_serve_ns']['median']:.0f} ns/id, lookup dim "
              f"{args.dim} {row['lookup_ns']['median']:.0f} ns/id")
    for capacity in [int(c) for c in args.capacities.split(",")] if args.ranks > 1 else []:
        report[f"exchange/{capacity}/{args.exchange_shards}/{args.ranks}"] = exchange = (
            measure_exchange(capacity, args))
        for name, row in exchange.items():
            print(f"capacity {capacity:,}, {args.exchange_shards} parts on {args.ranks} "
                  f"ranks, {name}: {row['step_ms']['median']:.1f} ms/step "
                  f"[{row['step_ms']['min']:.1f}-{row['step_ms']['max']:.1f}], "
                  f"CPU {row['cpu_ms_all_ranks']['median']:.1f} ms (all ranks), "
                  f"{row['bytes_sent_per_rank']['median'] / 1024:.0f} KiB sent per rank")
    report["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    write_json_atomic(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
