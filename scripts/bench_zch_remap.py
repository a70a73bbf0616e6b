"""The managed-collision remap per id, against the embedding lookup it precedes.

For each capacity: a warm remapper (filled by earlier steps of the same stream) remaps one
training step's ids (Zipf over ``--universe`` raw keys, so ids are admitted and evicted every
step), and, read-only, a serving batch; the lookup is the forward of one pooled table of
``capacity`` rows x ``--dim`` on the same slots (the native/FBGEMM kernel the
EmbeddingBagCollection picks). Times are per id: the median over ``--repeats`` runs of the
median of ``--steps`` steps, and the spread (min-max) over runs. ``--shards 1,8`` measures
the remapper whole and split into 8 parts held by one process (the cost of routing keys to
their parts; each part admits and evicts on its own).

Usage:
    python scripts/bench_zch_remap.py [--capacities 10000,100000] [--shards 1] [--batch 16384]
        [--dim 64] [--steps 9] [--repeats 3] [--threads 1] [--out bench-out/zch_remap.json]
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)},
                              "load_before": Path("/proc/loadavg").read_text().split()[:3]}
    cases = [(int(c), int(s)) for c in args.capacities.split(",")
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
    report["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    write_json_atomic(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
