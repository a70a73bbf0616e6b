"""Loader throughput: Parquet -> ready (dense, KeyedJaggedTensor, labels) batches.

Criteo shape: 13 dense, 26 one-hot sparse features, batch 4096, row groups of 64k rows. Each
run measures in the same process, as medians over repeats of one epoch:

* ``ctrctl``: :class:`ctrctl.data.dataset.BatchLoader`, shuffled, with its reader threads;
* ``pyarrow-iter``: the straightforward reference: ``ParquetFile.iter_batches`` then a
  per-batch conversion to torch tensors and a KeyedJaggedTensor (no shuffling, one thread);
* ``in-memory``: the ceiling: the whole split already in numpy, batches only sliced.

Usage:
    python scripts/bench_loader.py [--quick] [--rows 1000000] [--out bench-out/loader.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.io import write_json_atomic
from ctrctl.sparse import KeyedJaggedTensor
from ctrctl.testing.datasets import make_dataset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small, fast variant")
    parser.add_argument("--rows", type=int, default=1_000_000, help="training rows")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench-out/loader.json"))
    return parser.parse_args(argv)


def _time_epochs(make_iter, repeats: int) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Samples per wall second and per CPU second (all threads) of each repeat.

    The CPU figure is steadier on a shared machine: it counts the work, not the waiting.
    """
    rates, cpu_rates = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        rows = 0
        for batch in make_iter():
            rows += int(batch[2].shape[0]) if isinstance(batch, tuple) else batch.batch_size
        rates.append(rows / (time.perf_counter() - start))
        cpu_rates.append(rows / max(time.process_time() - cpu_start, 1e-9))
    return rates, cpu_rates


def _pyarrow_iter(files: list[Path], dense: list[str], sparse: list[str], batch_size: int):  # type: ignore[no-untyped-def]
    for path in files:
        for rb in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            d = torch.stack([torch.from_numpy(rb.column(n).to_numpy()) for n in dense], dim=1)
            ids = torch.cat([torch.from_numpy(rb.column(n).to_numpy()) for n in sparse])
            kjt = KeyedJaggedTensor(sparse, ids, lengths=torch.ones(ids.numel(), dtype=torch.int32))
            yield d, kjt, torch.from_numpy(rb.column("label").to_numpy().astype(np.float32))


def _in_memory(files: list[Path], dense: list[str], sparse: list[str], batch_size: int):  # type: ignore[no-untyped-def]
    table = pq.read_table(files[0]) if len(files) == 1 else None
    assert table is not None
    d = np.stack([table.column(n).to_numpy() for n in dense], axis=1)
    ids = np.stack([table.column(n).to_numpy() for n in sparse])  # (F, N)
    labels = table.column("label").to_numpy().astype(np.float32)

    def run():  # type: ignore[no-untyped-def]
        for s in range(0, labels.shape[0], batch_size):
            e = min(s + batch_size, labels.shape[0])
            values = torch.from_numpy(np.ascontiguousarray(ids[:, s:e]).reshape(-1))
            kjt = KeyedJaggedTensor(sparse, values,
                                    lengths=torch.ones(values.numel(), dtype=torch.int32))
            yield torch.from_numpy(d[s:e]), kjt, torch.from_numpy(labels[s:e])

    return run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = 200_000 if args.quick else args.rows
    repeats = 3 if args.quick else args.repeats
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        info = make_dataset(Path(tmp) / "ds", {"train": rows, "val": 1}, num_sparse=26,
                            num_dense=13, num_embeddings=100_000, row_group_size=65_536)
        m = info.manifest
        files = [info.path / f for f in m.split("train").files]
        loader = BatchLoader(info.path, "train", args.batch_size, shuffle=True, seed=0,
                             num_workers=args.workers, shuffle_buffer=262_144)
        ours, ours_cpu = _time_epochs(lambda: loader.epoch(0), repeats)
        ref, ref_cpu = _time_epochs(
            lambda: _pyarrow_iter(files, m.dense_names, m.sparse_names, args.batch_size),
            repeats)
        ceiling, ceiling_cpu = _time_epochs(_in_memory(files, m.dense_names, m.sparse_names,
                                          args.batch_size), repeats)
    results = {
        "rows": rows, "batch_size": args.batch_size, "workers": args.workers,
        "repeats": repeats,
        "ctrctl_samples_per_s": statistics.median(ours),
        "pyarrow_iter_samples_per_s": statistics.median(ref),
        "in_memory_samples_per_s": statistics.median(ceiling),
        "ctrctl_samples_per_cpu_s": statistics.median(ours_cpu),
        "pyarrow_iter_samples_per_cpu_s": statistics.median(ref_cpu),
        "in_memory_samples_per_cpu_s": statistics.median(ceiling_cpu),
    }
    results["ratio_vs_pyarrow_iter"] = (results["ctrctl_samples_per_s"]
                                        / results["pyarrow_iter_samples_per_s"])
    results["ratio_vs_in_memory"] = (results["ctrctl_samples_per_s"]
                                     / results["in_memory_samples_per_s"])
    print(f"loader, {rows:,} rows, batch {args.batch_size}, medians of {repeats} epochs")
    print(f"{'loader':<28}{'samples/s':>14}{'ratio':>8}{'samples/cpu-s':>16}{'ratio':>8}")
    for name, key in (("ctrctl (shuffled, threads)", "ctrctl"),
                      ("pyarrow iter_batches", "pyarrow_iter"),
                      ("in-memory slicing", "in_memory")):
        wall, cpu = results[f"{key}_samples_per_s"], results[f"{key}_samples_per_cpu_s"]
        print(f"{name:<28}{wall:>14,.0f}{wall / results['ctrctl_samples_per_s']:>8.2f}"
              f"{cpu:>16,.0f}{cpu / results['ctrctl_samples_per_cpu_s']:>8.2f}")
    write_json_atomic(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
