"""The OS page cache (a plain mmap) against the cached tables' DRAM row cache, one run.

The workload: ``--tables`` tables (default 8) of ``--rows`` rows (1M) x dim 64 fp32, one
feature per table, one id per feature, sum pooling, batch 4096. The tables run:

* ``resident``: each table a tensor in DRAM, ``F.embedding_bag`` over it (the ceiling);
* ``mmap``: each table a file mapped with ``torch.from_file(shared=True)`` (MAP_SHARED, as an
  ``np.memmap`` in ``r+`` mode), ``F.embedding_bag`` over the mapped tensor; the OS page cache
  does the caching. The files are written and read through once before timing, so with the
  tables smaller than RAM they stay in the page cache: this measures the row cache against a
  warm page cache, not against disk reads;
* ``cached lf=X``: ctrctl's ``CachedEmbeddingBag`` (the ``fused_cached`` kernel: table files
  with a DRAM row cache of ``X x rows`` slots per table) at each of ``--load-factors``, lookups
  inline (no prefetch; ``scripts/bench_cached.py`` measures prefetch).

Two modes: ``forward`` (pooling only, under ``no_grad``) and ``train`` (forward, then the
backward with exact row-wise Adagrad fused in: for ``resident`` and ``mmap`` the plain-torch
kernel's :func:`row_gradients` + :func:`apply_sparse_update` on the (mapped) weights, the same
update the cached kernel applies to its cache rows). Ids are uniform (exponent 0) or
Zipf(``a``) for each of ``--zipf`` (rank r drawn with probability ~ r^-a, ranks scattered over
the rows). Before timing, each cached model's cache is filled with lookups of warm-up batches
until it holds as many rows as it can (Zipf ids may never fill it), then ``--warmup`` batches
of each mode run for every setting.

Per exponent and mode the settings take turns on the same batches (``--batches`` batches a
turn, ``--repeats`` turns, the order reversed every other turn), so load from other processes
falls on all alike. A turn's figure is samples / seconds over its batches; reported are the
median over turns, the spread (min-max) and the ratio to ``mmap`` taken within each turn.
The load average and the CPU are printed with the table.

Usage:
    nice -n 5 python scripts/bench_page_cache.py [--quick] [--tables 8] [--rows 1000000]
        [--batch 4096] [--batches 20] [--repeats 5] [--warmup 3] [--zipf 0,1.05]
        [--load-factors 0.05,0.2] [--threads 1] [--json bench-out/page_cache.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ctrctl.modules.cached_embedding import CachedEmbeddingBag
from ctrctl.modules.native import cpu_model
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig, apply_sparse_update, init_state
from ctrctl.modules.torch_embedding import row_gradients

DIM = 64
OPTIMIZER = EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=0.05)

Batch = tuple[torch.Tensor, torch.Tensor]  # (tables * batch,) ids, feature-major; offsets


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 2 tables x 50k rows, batch 1024, 2 turns of 3 batches")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows per table")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--batches", type=int, default=20, help="timed batches per turn")
    p.add_argument("--repeats", type=int, default=5, help="turns")
    p.add_argument("--warmup", type=int, default=3, help="batches per mode before timing")
    p.add_argument("--zipf", default="0,1.05", help="id skews (0: uniform)")
    p.add_argument("--load-factors", default="0.05,0.2")
    p.add_argument("--modes", default="forward,train")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads")
    p.add_argument("--cache-dir", default=None, help="where the table files go")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.tables, args.rows, args.batch = 2, 50_000, 1024
        args.batches, args.repeats, args.warmup = 3, 2, 1
    return args


def zipf_ids(rng: np.random.Generator, rows: int, n: int, zipf: float) -> np.ndarray:
    """``n`` ids in [0, rows): uniform for ``zipf <= 0``, else Zipf ranks scattered over rows."""
    if zipf <= 0:
        return rng.integers(0, rows, n)
    ranks = (rng.zipf(zipf, n) - 1) % rows
    return (ranks * 2_654_435_761 + 12_345) % rows  # hot ids scattered over the table


def make_batches(n: int, tables: int, batch: int, rows: int, zipf: float, seed: int
                 ) -> list[Batch]:
    rng = np.random.default_rng(seed)
    offsets = torch.arange(tables * batch + 1)
    return [(torch.from_numpy(zipf_ids(rng, rows, tables * batch, zipf)), offsets)
            for _ in range(n)]


def _loadavg() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


class PlainTables:
    """Tables as plain tensors (in DRAM or mapped files), the plain-torch kernel's update."""

    def __init__(self, weights: list[torch.Tensor], batch: int) -> None:
        self.weights = weights
        self.states = [init_state(OPTIMIZER.kind, w.size(0), w.size(1), torch.device("cpu"))
                       for w in weights]
        self.batch = batch
        self._offsets = torch.arange(batch + 1)
        self._lengths = torch.ones(batch, dtype=torch.long)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b = self.batch
        return torch.cat([F.embedding_bag(ids[t * b:(t + 1) * b], w, self._offsets, mode="sum",
                                          include_last_offset=True)
                          for t, w in enumerate(self.weights)], dim=1)

    def train(self, ids: torch.Tensor, grad_out: torch.Tensor) -> None:
        self.forward(ids)
        b = self.batch
        for t, w in enumerate(self.weights):
            t_ids = ids[t * b:(t + 1) * b]
            rows, grad, _ = row_gradients(grad_out[:, t * DIM:(t + 1) * DIM], t_ids,
                                          self._lengths, w, "sum", None, False)
            apply_sparse_update(OPTIMIZER, OPTIMIZER.lr, w, self.states[t], rows, grad)


class Setting:
    """One contender: how it runs a batch in each mode, and its turns' seconds."""

    def __init__(self, name: str, forward: Callable[[Batch], Any],
                 train: Callable[[Batch], Any], bag: CachedEmbeddingBag | None = None,
                 load_factor: float | None = None) -> None:
        self.name, self.bag, self.load_factor = name, bag, load_factor
        self.run = {"forward": forward, "train": train}
        self.turns: dict[str, list[float]] = {"forward": [], "train": []}
        self.counters: dict[str, dict[str, int]] = {}

    def time(self, mode: str, batches: list[Batch]) -> float:
        run = self.run[mode]
        start = time.perf_counter()
        for b in batches:
            run(b)
        return time.perf_counter() - start


def _plain_setting(name: str, tables: PlainTables, grad_out: torch.Tensor) -> Setting:
    def forward(b: Batch) -> None:
        with torch.no_grad():
            tables.forward(b[0])

    def train(b: Batch) -> None:
        with torch.no_grad():
            tables.train(b[0], grad_out)

    return Setting(name, forward, train)


def _cached_setting(lf: float, args: argparse.Namespace, cache_dir: str,
                    grad_out: torch.Tensor) -> Setting:
    bag = CachedEmbeddingBag([(args.rows, DIM)] * args.tables, optimizer=OPTIMIZER,
                             cache_load_factor=lf, cache_dir=cache_dir)

    def forward(b: Batch) -> None:
        with torch.no_grad():
            bag(b[0], b[1])

    def train(b: Batch) -> None:
        bag(b[0], b[1]).backward(grad_out)

    return Setting(f"cached lf={lf}", forward, train, bag, lf)


def _fill(bag: CachedEmbeddingBag, batches: list[Batch]) -> int:
    """Look up batches (no training) until every cache holds what it can; batches used."""
    done = 0
    with torch.no_grad():
        for ids, offsets in batches:
            if all(int((c.slot_row[: c.main_slots] >= 0).sum()) >= c.main_slots
                   for c in bag.caches):
                break
            bag(ids, offsets)
            done += 1
    return done


def _mapped_tables(resident: list[torch.Tensor], directory: Path) -> list[torch.Tensor]:
    """The resident tables written to files and mapped (MAP_SHARED), read through once."""
    mapped = []
    for t, w in enumerate(resident):
        path = directory / f"mmap_{t}.f32"
        w.numpy().tofile(path)
        m = torch.from_file(str(path), shared=True, size=w.numel(), dtype=torch.float32)
        m = m.view(w.shape)
        float(m.sum())  # every page read once: the file sits in the page cache
        mapped.append(m)
    return mapped


def _summary(setting: Setting, reference: Setting, mode: str, samples: int
             ) -> dict[str, Any]:
    secs = setting.turns[mode]
    ratios = [r / s for s, r in zip(secs, reference.turns[mode], strict=True)]
    row: dict[str, Any] = {
        "setting": setting.name, "mode": mode, "load_factor": setting.load_factor,
        "samples_per_s": samples / statistics.median(secs),
        "samples_per_s_min": samples / max(secs), "samples_per_s_max": samples / min(secs),
        "vs_mmap": statistics.median(ratios), "vs_mmap_min": min(ratios),
        "vs_mmap_max": max(ratios),
    }
    if mode in setting.counters:
        c = setting.counters[mode]
        row["hit_rate"] = 1.0 - c["unique_misses"] / max(c["unique_ids"], 1)
    return row


def run_exponent(args: argparse.Namespace, zipf: float, factors: list[float], modes: list[str],
                 plain: list[Setting], grad_out: torch.Tensor, cache_dir: str
                 ) -> list[dict[str, Any]]:
    """Every setting and mode of one id skew, in turns on the same batches."""
    cached = [_cached_setting(lf, args, cache_dir, grad_out) for lf in factors]
    settings = plain + cached
    try:
        if cached:
            n_fill = int(1.5 * max(factors) * args.rows / args.batch) + 2
            fill = make_batches(n_fill, args.tables, args.batch, args.rows, zipf, seed=1)
            for s in cached:
                assert s.bag is not None
                used = _fill(s.bag, fill)
                print(f"  zipf {zipf} {s.name}: cache filled with {used} batches")
            del fill
        per_mode = args.warmup + args.batches * args.repeats
        rows: list[dict[str, Any]] = []
        for m, mode in enumerate(modes):
            batches = make_batches(per_mode, args.tables, args.batch, args.rows, zipf,
                                   seed=2 + m)
            for s in settings:
                s.time(mode, batches[: args.warmup])
            before = {s.name: s.bag.counters() for s in cached if s.bag is not None}
            for r in range(args.repeats):
                block = batches[args.warmup + r * args.batches:
                                args.warmup + (r + 1) * args.batches]
                for s in settings if r % 2 == 0 else settings[::-1]:
                    s.turns[mode].append(s.time(mode, block))
            for s in cached:
                assert s.bag is not None
                after = s.bag.counters()
                s.counters[mode] = {
                    k: sum(a[k] - b[k] for a, b in zip(after, before[s.name], strict=True))
                    for k in ("unique_ids", "unique_misses")}
            samples = args.batch * args.batches
            reference = next(s for s in settings if s.name == "mmap")
            rows += [{"zipf": zipf, **_summary(s, reference, mode, samples)} for s in settings]
        return rows
    finally:
        for s in plain:
            s.turns = {"forward": [], "train": []}
        for s in cached:
            if s.bag is not None:
                s.bag.close()
        gc.collect()


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| ids | mode | table | samples/s (median [min-max]) | x mmap (median [min-max]) "
             "| row cache hit rate |", "|---|---|---|---|---|---|"]
    for r in rows:
        ids = "uniform" if r["zipf"] <= 0 else f"Zipf({r['zipf']:g})"
        rate = (f"{r['samples_per_s']:,.0f} [{r['samples_per_s_min']:,.0f}-"
                f"{r['samples_per_s_max']:,.0f}]")
        ratio = f"{r['vs_mmap']:.2f} [{r['vs_mmap_min']:.2f}-{r['vs_mmap_max']:.2f}]"
        hit = f"{r['hit_rate']:.3f}" if "hit_rate" in r else "-"
        lines.append(f"| {ids} | {r['mode']} | {r['setting']} | {rate} | {ratio} | {hit} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    exponents = [float(x) for x in args.zipf.split(",") if x]
    factors = [float(x) for x in args.load_factors.split(",") if x]
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - {"forward", "train"}
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}: forward, train")
    base = args.cache_dir or tempfile.gettempdir()
    cache_dir = tempfile.mkdtemp(prefix="bench-page-cache-", dir=base)
    started_at = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    load_start = _loadavg()
    cpu = cpu_model()
    started = time.perf_counter()
    print(f"{started_at}; CPU: {cpu}; torch {torch.__version__}, {args.threads} thread(s)")
    print(f"load average (1, 5, 15 min) at start: {load_start}")
    gb = args.tables * args.rows * DIM * 4 / 1e9
    print(f"{args.tables} tables x {args.rows:,} rows x {DIM} fp32 ({gb:.2f} GB), batch "
          f"{args.batch}, one id per table; {args.repeats} turns x {args.batches} batches "
          f"after {args.warmup} per mode")
    rows: list[dict[str, Any]] = []
    try:
        torch.manual_seed(0)
        bound = (1.0 / args.rows) ** 0.5
        resident = [torch.empty(args.rows, DIM).uniform_(-bound, bound)
                    for _ in range(args.tables)]
        mapped = _mapped_tables(resident, Path(cache_dir))
        grad_out = torch.randn(args.batch, args.tables * DIM) * 1e-3
        plain = [_plain_setting("resident", PlainTables(resident, args.batch), grad_out),
                 _plain_setting("mmap", PlainTables(mapped, args.batch), grad_out)]
        print(f"tables ready ({time.perf_counter() - started:.0f} s)")
        for zipf in exponents:
            part = run_exponent(args, zipf, factors, modes, plain, grad_out, cache_dir)
            rows += part
            print(markdown(part), flush=True)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    load_end = _loadavg()
    elapsed = time.perf_counter() - started
    print()
    print(markdown(rows))
    print(f"\nload average at end: {load_end}; {elapsed:.0f} s")
    if args.json:
        report = {"config": vars(args), "started": started_at, "cpu": cpu,
                  "torch": torch.__version__, "loadavg_start": load_start,
                  "loadavg_end": load_end, "seconds": elapsed, "rows": rows}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
