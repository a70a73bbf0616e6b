"""Speed of cached tables against resident ones: load factor x id skew x prefetch, one run.

The workload: a DLRM-like model whose embeddings are one big table (default 1M rows x dim
64) looked up by ``--features`` features (one id each), 13 dense features, dense arch 256,128,64,
dot interaction, over arch 256,128,1, batch 4096, exact row-wise Adagrad fused into backward and
Adagrad on the dense part. Each step is forward + BCE loss + backward (with the fused update)
+ dense step on batches made before timing, fresh ones every step. The table runs:

* ``resident``: in DRAM on the kernel ``backend="auto"`` picks (the native C kernel on CPU):
  the reference every ratio is taken against;
* ``resident-torch``: in DRAM on the plain-torch kernel, whose pooling and update the cached
  kernel shares (where the gap to ``resident`` that is not the cache comes from);
* ``cached``: the ``fused_cached`` kernel (file on disk, DRAM row cache) at load factors
  ``--load-factors`` (0.05, 0.2, 0.5), with prefetch off (the forward looks up inline) and on
  (``prefetch`` of batch i+1 issued between forward(i) and backward(i), as the prefetch
  train pipeline does; it runs through backward(i), and forward(i+1) waits for it).

Ids are uniform (exponent 0) or Zipf(``a``) for each of ``--zipf`` (rank r drawn with
probability ~ r^-a, ranks scattered over the rows). Before timing each cached model's cache
is filled with lookups (no training) of warm-up batches until it holds as many rows as it
can, then ``--warmup`` training steps run; the hit rate counts the timed steps only.

Per exponent, every setting gets its own model, and all of them train on the same batches
in turns (``--steps`` steps each, ``--repeats`` turns), so load from other processes falls on
all alike. A turn's figure is its median step; reported are the median over turns, the spread
(min-max) and the ratio to ``resident`` taken within each turn. Beside them: forward and
backward time per step, the training thread's CPU time per step (below the step time: it
waited for a core, the GIL or the prefetch), and the lookup time per step (for prefetch: on
the worker thread) and how long the training thread waited for prefetches. ``cat /proc/loadavg`` is printed before and after.

Usage:
    python scripts/bench_cached.py [--quick] [--rows 1000000] [--batch 4096] [--features 4]
                                   [--steps 6] [--repeats 4] [--zipf 0,1.05,1.2]
                                   [--load-factors 0.05,0.2,0.5] [--threads 1]
                                   [--out bench-out/cached.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrctl.modules import DLRM, EmbeddingBagCollection, EmbeddingBagConfig
from ctrctl.modules.cached_embedding import CachedEmbeddingBag
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.sparse import KeyedJaggedTensor

DIM = 64
DENSE = 13

Batch = tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="250k rows, batch 2048, 2 features, 2 turns of 4 steps")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--features", type=int, default=4, help="features looking up the table")
    p.add_argument("--steps", type=int, default=6, help="timed steps per turn")
    p.add_argument("--repeats", type=int, default=4, help="turns")
    p.add_argument("--warmup", type=int, default=3, help="training steps before timing")
    p.add_argument("--zipf", default="0,1.05,1.2", help="id skews (0: uniform)")
    p.add_argument("--load-factors", default="0.05,0.2,0.5")
    p.add_argument("--no-torch-kernel", action="store_true", help="skip resident-torch")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads (the prefetch worker is one more thread)")
    p.add_argument("--cache-dir", default=None, help="where the table files go")
    p.add_argument("--out", default="bench-out/cached.json")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.batch, args.features = 250_000, 2048, 2
        args.steps, args.repeats = 4, 2
    return args


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _ids(rng: np.random.Generator, rows: int, n: int, zipf: float) -> np.ndarray:
    if zipf <= 0:
        return rng.integers(0, rows, n)
    ranks = (rng.zipf(zipf, n) - 1) % rows
    return (ranks * 2_654_435_761 + 12_345) % rows  # hot ids scattered over the table


def _batches(n: int, batch: int, features: int, rows: int, zipf: float, seed: int
             ) -> list[Batch]:
    rng = np.random.default_rng(seed)
    keys = [f"f{i}" for i in range(features)]
    out = []
    for _ in range(n):
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys, torch.from_numpy(_ids(rng, rows, features * batch, zipf)),
            torch.ones(features * batch, dtype=torch.long))
        out.append((torch.randn(batch, DENSE), kjt, torch.randint(0, 2, (batch,)).float()))
    return out


def _model(rows: int, features: int, backend: str, load_factor: float | None,
           cache_dir: str) -> DLRM:
    table = EmbeddingBagConfig("big", rows, DIM, [f"f{i}" for i in range(features)])
    ebc = EmbeddingBagCollection(
        [table], EmbeddingOptimizerConfig(lr=0.05), backend=backend, seed=0,
        cached_tables={"big": load_factor} if load_factor is not None else None,
        cache_dir=cache_dir)
    return DLRM(ebc, DENSE, [256, 128, DIM], [256, 128, 1])


def _bag(model: DLRM) -> CachedEmbeddingBag | None:
    for bag in model.sparse_arch.bags:
        if isinstance(bag, CachedEmbeddingBag):
            return bag
    return None


@dataclass
class Setting:
    """One model of the grid and what its turns measured."""

    name: str
    model: DLRM
    prefetch: bool = False
    load_factor: float | None = None
    turns: list[dict[str, float]] = field(default_factory=list)
    optimizer: torch.optim.Optimizer | None = None

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.Adagrad(
            [p for n, p in self.model.named_parameters() if not n.startswith("sparse_arch")],
            lr=0.01)


def _fill(setting: Setting, batches: list[Batch]) -> int:
    """Look up warm-up batches (no training) until the cache holds what it can; lookups."""
    bag = _bag(setting.model)
    if bag is None:
        return 0
    cache = bag.caches[0]
    done = 0
    with torch.no_grad():
        for _, kjt, _ in batches:
            if int((cache.slot_row[: cache.main_slots] >= 0).sum()) >= cache.main_slots:
                break
            setting.model.sparse_arch(kjt)
            done += 1
    return done


def _steps(setting: Setting, batches: list[Batch]) -> dict[str, float]:
    """Train on ``batches``; the turn's medians and the cache's counters over it."""
    model, ebc, bag = setting.model, setting.model.sparse_arch, _bag(setting.model)
    assert setting.optimizer is not None
    loss_fn = torch.nn.BCEWithLogitsLoss()
    before = bag.counters()[0] if bag is not None else {}
    step_s, fwd_s, bwd_s, cpu_s, lookup_s, wait_s = [], [], [], [], [], []
    if setting.prefetch:
        ebc.prefetch(batches[0][1])
    for i, (dense, kjt, labels) in enumerate(batches):
        looked = bag.lookup_seconds if bag is not None else 0.0
        waited = bag.prefetch_wait_seconds if bag is not None else 0.0
        start, cpu = time.perf_counter(), time.thread_time()
        logits = model(dense, kjt)
        if setting.prefetch and i + 1 < len(batches):
            ebc.prefetch(batches[i + 1][1])  # batch i+1's rows come in during backward(i)
        loss = loss_fn(logits, labels)
        mid = time.perf_counter()
        setting.optimizer.zero_grad()
        loss.backward()
        setting.optimizer.step()
        end = time.perf_counter()
        cpu_s.append(time.thread_time() - cpu)
        step_s.append(end - start)
        fwd_s.append(mid - start)
        bwd_s.append(end - mid)
        if bag is not None:
            lookup_s.append(bag.lookup_seconds - looked)
            wait_s.append(bag.prefetch_wait_seconds - waited)
    out = {"step_s": statistics.median(step_s), "forward_s": statistics.median(fwd_s),
           "backward_s": statistics.median(bwd_s), "cpu_s": statistics.median(cpu_s)}
    if bag is not None:
        after = bag.counters()[0]
        c = {k: after[k] - before.get(k, 0) for k in after}
        out.update(lookup_s=statistics.median(lookup_s), wait_s=statistics.median(wait_s),
                   unique_ids=c["unique_ids"], unique_misses=c["unique_misses"],
                   conflict_misses=c["conflict_misses"], forward_misses=c["forward_misses"])
    return out


def _summary(setting: Setting, resident: Setting, batch: int) -> dict[str, Any]:
    turns = setting.turns
    steps = [t["step_s"] for t in turns]
    ratios = [t["step_s"] / r["step_s"] for t, r in zip(turns, resident.turns, strict=True)]
    row: dict[str, Any] = {
        "setting": setting.name, "load_factor": setting.load_factor,
        "prefetch": setting.prefetch,
        "samples_per_s": batch / statistics.median(steps),
        "samples_per_s_min": batch / max(steps), "samples_per_s_max": batch / min(steps),
        "vs_resident": statistics.median(ratios), "vs_resident_min": min(ratios),
        "vs_resident_max": max(ratios),
        "forward_ms": 1e3 * statistics.median(t["forward_s"] for t in turns),
        "backward_ms": 1e3 * statistics.median(t["backward_s"] for t in turns),
        "thread_cpu_ms": 1e3 * statistics.median(t["cpu_s"] for t in turns),
    }
    if "unique_ids" in turns[0]:
        unique = sum(t["unique_ids"] for t in turns)
        row.update(
            hit_rate=1.0 - sum(t["unique_misses"] for t in turns) / max(unique, 1),
            conflict_misses=sum(t["conflict_misses"] for t in turns),
            forward_misses=sum(t["forward_misses"] for t in turns),
            lookup_ms=1e3 * statistics.median(t["lookup_s"] for t in turns),
            wait_ms=1e3 * statistics.median(t["wait_s"] for t in turns),
        )
    return row


def run_exponent(args: argparse.Namespace, zipf: float, factors: list[float],
                 cache_dir: str) -> list[dict[str, Any]]:
    """Every setting of one id skew, in turns on the same batches."""
    torch.manual_seed(0)
    settings = [Setting("resident", _model(args.rows, args.features, "auto", None, cache_dir))]
    if not args.no_torch_kernel:
        settings.append(Setting("resident-torch",
                                _model(args.rows, args.features, "torch", None, cache_dir)))
    for lf in factors:
        for prefetch in (False, True):
            settings.append(Setting(
                f"cached lf={lf} {'prefetch' if prefetch else 'inline'}",
                _model(args.rows, args.features, "torch", lf, cache_dir), prefetch, lf))
    ids_per_batch = args.features * args.batch
    fill_batches = int(2.5 * max(factors) * args.rows / ids_per_batch) + 2
    fill = _batches(fill_batches, args.batch, args.features, args.rows, zipf, seed=1)
    timed = _batches(args.warmup + args.steps * args.repeats, args.batch, args.features,
                     args.rows, zipf, seed=2)
    for s in settings:
        _fill(s, fill)
        _steps(s, timed[: args.warmup])
    del fill
    for r in range(args.repeats):
        block = timed[args.warmup + r * args.steps : args.warmup + (r + 1) * args.steps]
        order = settings if r % 2 == 0 else settings[::-1]  # neither end always first
        for s in order:
            s.turns.append(_steps(s, block))
    rows = [{"zipf": zipf, **_summary(s, settings[0], args.batch)} for s in settings]
    for s in settings:
        bag = _bag(s.model)
        if bag is not None:
            bag.close()
    settings.clear()
    gc.collect()
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    print(f"{'zipf':<5} {'setting':<26} {'samples/s (min..max)':<24} {'x resident (min..max)':<22}"
          f" {'hit':>5} {'fwd ms':>7} {'bwd ms':>7} {'cpu ms':>7} {'lookup':>7} {'wait':>6}")
    for r in rows:
        rate = (f"{r['samples_per_s']:8,.0f} ({r['samples_per_s_min']:,.0f}.."
                f"{r['samples_per_s_max']:,.0f})")
        ratio = f"{r['vs_resident']:5.2f} ({r['vs_resident_min']:.2f}..{r['vs_resident_max']:.2f})"
        extra = ""
        if "hit_rate" in r:
            extra = f"{r['hit_rate']:5.3f} "
        else:
            extra = f"{'-':>5} "
        extra += f"{r['forward_ms']:7.1f} {r['backward_ms']:7.1f} {r['thread_cpu_ms']:7.1f}"
        if "lookup_ms" in r:
            extra += f" {r['lookup_ms']:7.1f} {r['wait_ms']:6.1f}"
        print(f"{r['zipf']:<5} {r['setting']:<26} {rate:<24} {ratio:<22} {extra}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    exponents = [float(x) for x in args.zipf.split(",") if x]
    factors = [float(x) for x in args.load_factors.split(",") if x]
    base = args.cache_dir or tempfile.gettempdir()
    cache_dir = tempfile.mkdtemp(prefix="bench-cached-", dir=base)
    load_start = _loadavg()
    started = time.perf_counter()
    print(f"loadavg at start: {load_start}")
    print(f"table {args.rows:,} x {DIM}, {args.features} features, batch {args.batch}, "
          f"{args.threads} intra-op thread(s); per setting {args.repeats} turns x "
          f"{args.steps} steps after {args.warmup}")
    rows: list[dict[str, Any]] = []
    try:
        for zipf in exponents:
            part = run_exponent(args, zipf, factors, cache_dir)
            _print(part)
            rows += part
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    load_end = _loadavg()
    print(f"loadavg at end: {load_end} ({time.perf_counter() - started:.0f} s)")
    report = {"config": {k: v for k, v in vars(args).items()}, "loadavg_start": load_start,
              "loadavg_end": load_end, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
