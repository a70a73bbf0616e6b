"""Cached (disk + DRAM row cache) embedding tables on CPU: larger than RAM, and their speed.

Two parts, in one run:

* ``large``: a DLRM whose largest table (default 120M rows x dim 64, exact rowwise Adagrad:
  ~31 GB with its state, more than the machine's RAM) is a ``fused_cached`` table with a
  small load factor, plus three resident tables, Zipf-distributed ids, prefetch on. Prints
  samples/s, the cache hit rate, peak RSS and the disk the sparse files really use.
* ``sweep``: the same DLRM with a smaller big table (default 2M rows) trained resident (the
  plain-torch kernel, whose numerics the cached kernel shares) and cached at load factors
  0.05 / 0.2 / 0.5, ids uniform or Zipf(1.05) / Zipf(1.2), prefetch on and off. The hit
  rate counts the timed steps only (after ``--warmup`` steps that fill the cache). Median step
  time over the timed steps (spread min..max), ratio cached / resident measured in the same
  run, hit rate, and the lookup (prefetch) time per step against forward and backward.

With prefetch, batch i+1's rows are fetched on the worker thread between forward(i) and
backward(i), overlapping backward(i) (the embedding backward does not wait for it; the
forward of batch i+1 does). Without, the forward looks up inline.

Usage:
    python scripts/bench_offload.py [--quick] [--large-rows 120000000] [--sweep-rows 2000000]
                                    [--steps 8] [--out bench-out/offload.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ctrctl.modules import DLRM, EmbeddingBagCollection, EmbeddingBagConfig
from ctrctl.modules.cached_embedding import CachedEmbeddingBag
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.sparse import KeyedJaggedTensor

DIM = 64
SMALL_ROWS = 10_000
DENSE = 13


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ids(rng: np.random.Generator, rows: int, n: int, zipf: float) -> np.ndarray:
    if zipf <= 0:
        return rng.integers(0, rows, n)
    ranks = (rng.zipf(zipf, n) - 1) % rows
    return (ranks * 2_654_435_761 + 12_345) % rows  # hot ids scattered over the table


def _batches(steps: int, batch: int, big_rows: int, zipf: float, seed: int = 0
             ) -> list[tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        values = np.concatenate([_ids(rng, big_rows, batch, zipf)]
                                + [_ids(rng, SMALL_ROWS, batch, zipf) for _ in range(3)])
        kjt = KeyedJaggedTensor.from_lengths_sync(
            ["big", "s0", "s1", "s2"], torch.from_numpy(values), torch.ones(4 * batch,
                                                                           dtype=torch.long))
        out.append((torch.randn(batch, DENSE), kjt, torch.randint(0, 2, (batch,)).float()))
    return out


def _model(big_rows: int, load_factor: float | None, cache_dir: str) -> DLRM:
    tables = [EmbeddingBagConfig("big", big_rows, DIM, ["big"])] + [
        EmbeddingBagConfig(f"s{i}", SMALL_ROWS, DIM, [f"s{i}"]) for i in range(3)]
    cached = {"big": load_factor} if load_factor is not None else None
    ebc = EmbeddingBagCollection(tables, EmbeddingOptimizerConfig(lr=0.05), backend="torch",
                                 seed=0, cached_tables=cached, cache_dir=cache_dir)
    return DLRM(ebc, DENSE, [64, DIM], [64, 1])


def _cached_bag(model: DLRM) -> CachedEmbeddingBag | None:
    for bag in model.sparse_arch.bags:
        if isinstance(bag, CachedEmbeddingBag):
            return bag
    return None


def _train(model: DLRM, batches: list, warmup: int, prefetch: bool) -> dict[str, float]:
    """Train on ``batches``; medians over the steps after ``warmup``."""
    ebc = model.sparse_arch
    dense_opt = torch.optim.Adagrad([p for n, p in model.named_parameters()
                                     if not n.startswith("sparse_arch")], lr=0.01)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    bag = _cached_bag(model)
    steps, fwd, bwd, lookup = [], [], [], []
    counted = bag.counters()[0] if bag is not None and warmup == 0 else None
    if prefetch:
        ebc.prefetch(batches[0][1])
    for i, (dense, kjt, labels) in enumerate(batches):
        looked = bag.lookup_seconds if bag is not None else 0.0
        start = time.perf_counter()
        logits = model(dense, kjt)
        if prefetch and i + 1 < len(batches):
            ebc.prefetch(batches[i + 1][1])
        loss = loss_fn(logits, labels)
        mid = time.perf_counter()
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        end = time.perf_counter()
        if i + 1 == warmup and bag is not None:
            counted = bag.counters()[0]  # hit rate over the timed steps only
        if i >= warmup:
            steps.append(end - start)
            fwd.append(mid - start)
            bwd.append(end - mid)
            if bag is not None:
                lookup.append(bag.lookup_seconds - looked)
    batch = batches[0][0].size(0)
    out = {"step_s": statistics.median(steps), "step_min_s": min(steps),
           "step_max_s": max(steps), "samples_per_s": batch / statistics.median(steps),
           "forward_s": statistics.median(fwd), "backward_s": statistics.median(bwd)}
    if bag is not None:
        now = bag.counters()[0]
        c = {k: v - (counted or {}).get(k, 0) for k, v in now.items()}
        out["lookup_s"] = statistics.median(lookup)
        out["hit_rate"] = 1.0 - c["unique_misses"] / max(c["unique_ids"], 1)
        out["forward_misses"] = c["forward_misses"]
        out["conflict_misses"] = c["conflict_misses"]
    return out


def run_large(rows: int, load_factor: float, steps: int, batch: int, zipf: float,
              cache_dir: str) -> dict[str, float]:
    """The larger-than-RAM table: throughput, hit rate, RSS and disk."""
    rss_start = _rss_mb()
    model = _model(rows, load_factor, cache_dir)
    bag = _cached_bag(model)
    assert bag is not None
    batches = _batches(steps, batch, rows, zipf, seed=1)
    rss_series = []
    result = _train(model, batches[: steps // 2], warmup=2, prefetch=True)
    rss_series.append(_rss_mb())
    result = _train(model, batches[steps // 2 :], warmup=0, prefetch=True)
    rss_series.append(_rss_mb())
    store = bag.caches[0].store
    flush_start = time.perf_counter()
    bag.flush()  # every row trained so far goes to the file: what the disk holds for them
    flush_s = time.perf_counter() - flush_start
    table_bytes = rows * store.row_bytes
    result.update({
        "rows": rows, "table_gb": table_bytes / 1e9, "load_factor": load_factor,
        "cache_dram_gb": bag.dram_bytes() / 1e9, "rss_start_mb": rss_start,
        "rss_mb_after_half_and_end": rss_series, "peak_rss_mb": _peak_rss_mb(),
        "disk_used_mb": store.disk_bytes() / 2**20, "locked_rows_after": bag.locked_rows(),
        "rows_on_disk": int(store.touched.sum()), "flush_s": flush_s,
        "rows_written_back": bag.counters()[0]["rows_written_back"],
        "zipf": zipf, "batch": batch,
    })
    bag.close()
    return result


def run_sweep(rows: int, steps: int, warmup: int, batch: int, cache_dir: str,
              factors: list[float], exponents: list[float]) -> list[dict[str, float]]:
    out = []
    for zipf in exponents:
        batches = _batches(warmup + steps, batch, rows, zipf, seed=2)
        torch.manual_seed(0)
        resident = _train(_model(rows, None, cache_dir), batches, warmup, prefetch=False)
        out.append({"zipf": zipf, "kernel": "resident", **resident})
        for lf in factors:
            for prefetch in (False, True):
                torch.manual_seed(0)
                model = _model(rows, lf, cache_dir)
                row = _train(model, batches, warmup, prefetch)
                row.update(zipf=zipf, kernel="cached", load_factor=lf, prefetch=prefetch,
                           vs_resident=row["step_s"] / resident["step_s"])
                out.append(row)
                bag = _cached_bag(model)
                if bag is not None:
                    bag.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps, smaller sweep table")
    p.add_argument("--large-rows", type=int, default=120_000_000)
    p.add_argument("--large-load-factor", type=float, default=0.02)
    p.add_argument("--sweep-rows", type=int, default=500_000)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=15, help="steps before timing (cache warm-up)")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads (2 on a loaded 2-core machine made steps 50x slower)")
    p.add_argument("--cache-dir", default=None, help="where the table files go (a disk)")
    p.add_argument("--skip-large", action="store_true")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--out", default="bench-out/offload.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.steps, args.warmup, args.sweep_rows = 5, 5, 100_000
    base = args.cache_dir or tempfile.gettempdir()
    cache_dir = tempfile.mkdtemp(prefix="bench-offload-", dir=base)
    print(f"loadavg at start: {open('/proc/loadavg').read().strip()}")
    print(f"disk free in {base}: {shutil.disk_usage(base).free / 2**30:.1f} GiB")
    report: dict[str, object] = {}
    try:
        if not args.skip_large:
            large = run_large(args.large_rows, args.large_load_factor, 2 * args.steps + 6,
                              args.batch, 1.05, cache_dir)
            report["large"] = large
            print(f"large: {large['rows']:,} rows x {DIM} = {large['table_gb']:.1f} GB with "
                  f"state, load factor {large['load_factor']}: "
                  f"{large['samples_per_s']:,.0f} samples/s, hit rate {large['hit_rate']:.3f}, "
                  f"peak RSS {large['peak_rss_mb']:,.0f} MB (RSS {large['rss_mb_after_half_and_end']}"
                  f" MB after half / all steps), after flush {large['rows_on_disk']:,} rows on disk "
                  f"using {large['disk_used_mb']:,.0f} MB")
            print(f"loadavg after large: {open('/proc/loadavg').read().strip()}")
        if not args.skip_sweep:
            rows = run_sweep(args.sweep_rows, args.steps, args.warmup, args.batch, cache_dir,
                             [0.05, 0.2, 0.5], [0.0, 1.05, 1.2])
            report["sweep"] = rows
            print(f"sweep: {args.sweep_rows:,} rows x {DIM}, batch {args.batch}, medians of "
                  f"{args.steps} steps after {args.warmup}")
            print("zipf  kernel    lf    prefetch  step ms (min..max)   x resident  hit   "
                  "lookup ms  fwd ms  bwd ms")
            for r in rows:
                print(f"{r['zipf']:<5} {r['kernel']:<9} {r.get('load_factor', '-'):<5} "
                      f"{str(r.get('prefetch', '-')):<9} {1e3 * r['step_s']:7.1f} "
                      f"({1e3 * r['step_min_s']:.0f}..{1e3 * r['step_max_s']:.0f})"
                      f"   {r.get('vs_resident', 1.0):6.2f}   "
                      f"{r.get('hit_rate', 1.0):.3f} {1e3 * r.get('lookup_s', 0.0):8.1f} "
                      f"{1e3 * r['forward_s']:7.1f} {1e3 * r['backward_s']:7.1f}")
            print(f"loadavg after sweep: {open('/proc/loadavg').read().strip()}")
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
