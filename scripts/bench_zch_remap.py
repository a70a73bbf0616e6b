"""The managed-collision remap per id, against the embedding lookup it precedes.

For each capacity: a warm remapper (filled by earlier steps of the same stream) remaps one
training step's ids (Zipf over ``--universe`` raw keys, so ids are admitted and evicted every
step), and, read-only, a serving batch; the lookup is the forward of one pooled table of
``capacity`` rows x ``--dim`` on the same slots (the native/FBGEMM kernel the
EmbeddingBagCollection picks). Times are per id: the median over ``--repeats`` runs of the
median of ``--steps`` steps, and the spread (min-max) over runs.

Usage:
    python scripts/bench_zch_remap.py [--capacities 10000,100000] [--batch 16384]
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
from ctrctl.sparse import KeyedJaggedTensor


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacities", default="10000,100000")
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


def measure(capacity: int, args: argparse.Namespace, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    remapper = CollisionRemapper(CollisionConfig(capacity=capacity, eviction="lru"))
    for _ in range(max(2, 4 * capacity // args.batch)):  # warm: the table full
        remapper.remap(zipf_keys(rng, args.batch, args.universe))
    ebc = EmbeddingBagCollection([EmbeddingBagConfig("t", capacity, args.dim, ["f"])])
    train, serve, lookup = [], [], []
    for _ in range(args.steps):
        keys = zipf_keys(rng, args.batch, args.universe)
        t0 = time.perf_counter()
        slots = remapper.remap(keys)
        train.append(time.perf_counter() - t0)
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
            "evictions_per_step": remapper.stats()["evictions"] / float(remapper.step)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)},
                              "load_before": Path("/proc/loadavg").read_text().split()[:3]}
    for capacity in (int(c) for c in args.capacities.split(",")):
        runs = [measure(capacity, args, seed) for seed in range(args.repeats)]
        row = {k: {"median": statistics.median(r[k] for r in runs),
                   "min": min(r[k] for r in runs), "max": max(r[k] for r in runs)}
               for k in runs[0]}
        report[str(capacity)] = row
        print(f"capacity {capacity:,}: remap (train) {row['remap_train_ns']['median']:.0f} "
              f"ns/id [{row['remap_train_ns']['min']:.0f}-{row['remap_train_ns']['max']:.0f}]"
              f", remap (serve) {row['remap_serve_ns']['median']:.0f} ns/id, lookup dim "
              f"{args.dim} {row['lookup_ns']['median']:.0f} ns/id")
    report["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    write_json_atomic(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
