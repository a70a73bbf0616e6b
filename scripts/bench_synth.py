"""Synthetic log throughput: ``synthesize`` rows/s against plain writers of the same rows.

For each format, on ``--rows`` rows (1M; ``--quick``: 200k), medians over ``--repeats``:

- ``synthesize``: the whole job, files written (logs, probabilities, synth.json, best AUC);
- ``generate``: the rows in memory only as numpy columns (click model, Zipf draws, hashing);
- ``encode``: the same columns turned into text by ctrctl's byte-matrix encoder (what
  ``synthesize`` writes), against three references in the same run on the same rows as an
  Arrow table: ctrctl's Arrow string join (``encode_lines``), polars ``write_csv``
  (vectorised) and Python string formatting (on a slice, scaled to rows/s).

The target is 1M rows/s for ``synthesize``; the ``x target`` column is rows/s / 1M. On a
shared machine wall time depends on the neighbours, so ``per CPU-s`` also gives rows per
CPU-second of this process (all its threads, user and system time, measured on the same runs
as the wall time): with ``W`` free cores expect up to ``W`` times it. The load average before
and after is printed beside them.

    .venv/bin/python scripts/bench_synth.py            # 1M rows
    .venv/bin/python scripts/bench_synth.py --quick    # 200k rows
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from ctrctl.data.synthetic import (
    CHUNK_ROWS,
    ChunkColumns,
    click_model,
    encode_lines,
    synthesize,
    text_of,
)
from ctrctl.io import write_json_atomic

TARGET_ROWS_PER_S = 1_000_000
PYTHON_REFERENCE_ROWS = 20_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200k rows instead of 1M")
    parser.add_argument("--rows", type=int, default=None, help="rows per run (overrides --quick)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=["criteo", "avazu"])
    parser.add_argument("--workers", type=int, default=None, help="threads (default: by CPUs)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/synth.json"))
    return parser.parse_args(argv)


def median_seconds(
    fn: Callable[[], Any], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def timed_runs(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Median wall, user and system seconds of ``repeats`` calls (CPU of all threads)."""
    walls, users, systems = [], [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        users.append(after.ru_utime - before.ru_utime)
        systems.append(after.ru_stime - before.ru_stime)
    return {
        "wall": statistics.median(walls),
        "user": statistics.median(users),
        "system": statistics.median(systems),
        "cpu": statistics.median(u + s for u, s in zip(users, systems, strict=True)),
    }


def python_lines(table: pa.Table, separator: str) -> bytes:
    """The reference a first version would write: one f-string-ish join per row."""
    columns = [column.to_pylist() for column in table.itercolumns()]
    out = io.StringIO()
    for row in zip(*columns, strict=True):
        out.write(separator.join("" if v is None else str(v) for v in row))
        out.write("\n")
    return out.getvalue().encode()


def chunk_columns(fmt: str, rows: int) -> list[ChunkColumns]:
    """The rows of ``synthesize`` as numpy columns, chunk by chunk."""
    model = click_model(fmt, 0)
    return [
        model.columns(chunk, start, min(CHUNK_ROWS, rows - start), rows)
        for chunk, start in enumerate(range(0, rows, CHUNK_ROWS))
    ]


def bench_format(fmt: str, rows: int, repeats: int, workers: int | None) -> dict[str, Any]:
    click_model(fmt, 0)  # build the model once, outside the timings (as a warm cache would)
    separator = "," if fmt == "avazu" else "\t"
    scratch = Path(tempfile.mkdtemp(prefix="bench-synth-"))
    try:

        def write() -> None:
            synthesize(scratch / "out", rows=rows, format=fmt, overwrite=True, workers=workers)

        write()  # the first run makes the text tables of the model's dictionaries
        load_before = os.getloadavg()[0]
        # CPU seconds of all threads: on a shared machine, wall time measures the neighbours.
        runs = timed_runs(write, repeats)
        load_after = os.getloadavg()[0]
        size = sum(p.stat().st_size for p in (scratch / "out").iterdir())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    generate_s = median_seconds(lambda: chunk_columns(fmt, rows), repeats)
    chunks = chunk_columns(fmt, rows)
    encode_s = median_seconds(lambda: [c.lines(separator).nbytes for c in chunks], repeats)
    tables = [c.table() for c in chunks]
    arrow_s = median_seconds(
        lambda: [len(text_of(encode_lines(t, separator))) for t in tables], repeats
    )
    frames = [pl.DataFrame(t) for t in tables]
    polars_s = median_seconds(
        lambda: [
            f.write_csv(io.BytesIO(), separator=separator, include_header=False) for f in frames
        ],
        repeats,
    )
    head = tables[0].slice(0, min(PYTHON_REFERENCE_ROWS, rows))
    python_s = median_seconds(lambda: python_lines(head, separator), repeats) * rows / len(head)
    # The encoder's text equals the reference's, or the comparison would mean nothing.
    reference = python_lines(head, separator)
    assert bytes(text_of(encode_lines(head, separator)))[1:] + b"\n" == reference
    lines = chunks[0].lines(separator).slice(0, head.num_rows)
    assert bytes(text_of(lines))[1:] + b"\n" == reference
    return {
        "format": fmt,
        "rows": rows,
        "bytes": size,
        "synthesize_rows_per_s": rows / runs["wall"],
        "synthesize_rows_per_cpu_s": rows / runs["cpu"],
        "synthesize_cpu_us_per_row": runs["cpu"] / rows * 1e6,
        "synthesize_user_s": runs["user"],
        "synthesize_system_s": runs["system"],
        "load_average_before": load_before,
        "load_average_after": load_after,
        "generate_rows_per_s": rows / generate_s,
        "encode_rows_per_s": rows / encode_s,
        "arrow_join_rows_per_s": rows / arrow_s,
        "polars_write_csv_rows_per_s": rows / polars_s,
        "python_format_rows_per_s": rows / python_s,
        "encode_vs_arrow_join": arrow_s / encode_s,
        "encode_vs_polars": polars_s / encode_s,
        "encode_vs_python": python_s / encode_s,
        "synthesize_vs_target": rows / runs["wall"] / TARGET_ROWS_PER_S,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = args.rows or (200_000 if args.quick else 1_000_000)
    results = [bench_format(fmt, rows, args.repeats, args.workers) for fmt in args.formats]
    header = (
        f"{'format':<8}{'synthesize':>12}{'x target':>9}{'per CPU-s':>11}{'CPU-us/row':>11}"
        f"{'sys s':>7}{'load':>11}{'generate':>11}{'encode':>11}{'arrow join':>12}"
        f"{'polars csv':>12}{'python':>10}{'enc/polars':>11}{'enc/python':>11}"
    )
    print(f"rows/s, {rows:,} rows, median of {args.repeats}, {os.cpu_count()} CPUs")
    print(header)
    for r in results:
        load = f"{r['load_average_before']:.1f}-{r['load_average_after']:.1f}"
        print(
            f"{r['format']:<8}{r['synthesize_rows_per_s']:>12,.0f}{r['synthesize_vs_target']:>9.2f}"
            f"{r['synthesize_rows_per_cpu_s']:>11,.0f}{r['synthesize_cpu_us_per_row']:>11.2f}"
            f"{r['synthesize_system_s']:>7.2f}{load:>11}"
            f"{r['generate_rows_per_s']:>11,.0f}{r['encode_rows_per_s']:>11,.0f}"
            f"{r['arrow_join_rows_per_s']:>12,.0f}"
            f"{r['polars_write_csv_rows_per_s']:>12,.0f}{r['python_format_rows_per_s']:>10,.0f}"
            f"{r['encode_vs_polars']:>11.2f}{r['encode_vs_python']:>11.1f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "synth",
        "rows": rows,
        "repeats": args.repeats,
        "quick": args.quick,
        "cpus": os.cpu_count(),
        "target_rows_per_s": TARGET_ROWS_PER_S,
        "results": results,
    }
    write_json_atomic(args.out, payload)
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
