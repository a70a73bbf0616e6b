"""Native fast path of ``ctrctl preprocess`` for the common shape of click logs.

A TSV input whose dense columns are integers and whose sparse columns are hex or integer keys
in hash mode (Criteo Kaggle, Criteo 1TB) is parsed, transformed and hashed in one pass by a
small C extension (``_fastparse.c``) on two threads, and written with pyarrow. The output is
the polars path's: the same columns, types, ids and float32 values, and the same counts
(``tests/data/test_fastpath.py`` compares the two).

The fast path accepts only rows that are certainly well formed. At the first row that is not,
it removes what it wrote and returns None; the caller then takes the polars path, which
reports or skips bad rows as it always has. Where the extension was not built (no C compiler
at install time), or ``CTRCTL_PREPROCESS_ENGINE=polars`` is set, only the polars path runs.

Example:
    >>> layout = fast_layout(schema, kinds)          # None: this schema needs the polars path
    >>> counts = stream_fast(layout, path, 0, rule, paths, 65_536, "lz4", progress)
"""

from __future__ import annotations

import gc
import gzip
import os
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ctrctl.data.readers import SPLIT_NAMES, is_gzip
from ctrctl.data.schema import Schema
from ctrctl.data.transforms import BAD_REASONS, random_unit_numpy
from ctrctl.progress import Progress

try:
    from ctrctl.data import _fastparse  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the polars path does everything
    _fastparse = None

#: Bytes read per block (about 15,000 Criteo rows); blocks are parsed on two threads.
BLOCK_BYTES = 4 << 20
THREADS = 2
#: Blocks parsed ahead of the one being taken: enough to keep both threads busy while a row
#: group (several blocks) is encoded and written on the writer thread.
LOOKAHEAD = 8
#: Row groups waiting for the writer thread at most.
WRITES_AHEAD = 2
#: The counts entry holding a split's :class:`SplitSummary`.
SUMMARY = "__summary"
#: Registers of the cardinality sketch: 2**14, a standard error of about 0.8%.
HLL_BITS = 14
#: Environment variable that selects the engine: ``auto`` (default) or ``polars``.
ENGINE_ENV = "CTRCTL_PREPROCESS_ENGINE"

#: A split rule: ("literal", split) | ("ratio", (train, val), stream, seed) | ("halves", rows).
SplitRule = tuple[Any, ...]


def available() -> bool:
    """Whether the native parser is built and not switched off."""
    return _fastparse is not None and os.environ.get(ENGINE_ENV, "auto") != "polars"


@dataclass(frozen=True)
class FastLayout:
    """What the C parser needs per schema column, and the output columns' names."""

    sep: int
    kinds: bytes
    transforms: bytes
    sizes: np.ndarray
    fills: np.ndarray
    lows: np.ndarray
    highs: np.ndarray
    label: str
    dense: tuple[str, ...]
    sparse: tuple[str, ...]

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(self.label, pa.int8())]
                         + [(n, pa.float32()) for n in self.dense]
                         + [(n, pa.int64()) for n in self.sparse])


def fast_layout(schema: Schema, kinds: Mapping[str, tuple[str, int | None, bool]]
                ) -> FastLayout | None:
    """The parser's layout for ``schema``, or None when the schema needs the polars path.

    Eligible: TSV; integer dense columns (log1p, none or clip); hex or int sparse keys in hash
    mode, one per field; 0/1 labels (no label mapping); no derived features and no
    ``time_column``; at most 64 dense columns.
    """
    if not available() or schema.format != "tsv" or schema.derived_features():
        return None
    if schema.time_column is not None:  # the parser writes no data-time column
        return None
    if schema.label_rule is not None:  # the parser takes 0/1 labels only
        return None
    codes, transforms = bytearray(), bytearray()
    sizes, fills, lows, highs = [], [], [], []
    for column in schema.columns:
        size, fill, low, high, transform = 0, 0.0, 0.0, 0.0, "n"
        if column.role == "label":
            code = "L"
        elif column.role == "dense":
            if column.value_type != "int":
                return None
            code, fill = "I", float(column.fill)
            transform = {"log1p": "l", "none": "n", "clip": "c"}[column.transform]
            if column.clip is not None:
                low, high = float(column.clip[0]), float(column.clip[1])
        elif column.role == "sparse":
            kind, hash_size, multi = kinds[column.name]
            if multi or not hash_size or kind not in ("hex", "int"):
                return None
            code, size = ("H" if kind == "hex" else "N"), hash_size
        else:
            code = "X"
        codes += code.encode()
        transforms += transform.encode()
        sizes.append(size)
        fills.append(fill)
        lows.append(low)
        highs.append(high)
    dense = tuple(c.name for c in schema.dense)
    if len(dense) > 64:
        return None
    return FastLayout(
        sep=ord(schema.sep), kinds=bytes(codes), transforms=bytes(transforms),
        sizes=np.asarray(sizes, np.int64), fills=np.asarray(fills, np.float64),
        lows=np.asarray(lows, np.float64), highs=np.asarray(highs, np.float64),
        label=schema.label, dense=dense, sparse=tuple(c.name for c in schema.sparse),
    )


def _blocks(path: Path, header_lines: int, block_bytes: int) -> Iterator[np.ndarray]:
    """Whole lines of ``path`` (plain or gzip) in uint8 blocks of about ``block_bytes``.

    numpy buffers, unlike bytearrays, are not zero-filled before the read overwrites them.
    """
    opener: Any = gzip.open if is_gzip(path) else open
    with opener(path, "rb") as handle:
        for _ in range(header_lines):
            handle.readline()
        rest = np.empty(0, np.uint8)
        while True:
            block = np.empty(len(rest) + block_bytes, np.uint8)
            block[: len(rest)] = rest
            size = len(rest) + (handle.readinto(block[len(rest):].data) or 0)
            if size == len(rest):  # end of input
                if len(rest):
                    yield rest
                return
            assert _fastparse is not None
            cut = _fastparse.last_line_end(block, len(rest), size)
            if cut < 0:  # no line ends in this block yet: read on
                rest = block[:size]
                continue
            rest = block[cut:size].copy()
            yield block[:cut]


@dataclass
class _Parsed:
    rows: int
    bad: int
    label: np.ndarray
    dense: np.ndarray
    sparse: np.ndarray
    missing: np.ndarray


def _parse(block: np.ndarray, layout: FastLayout) -> _Parsed:
    assert _fastparse is not None
    capacity = _fastparse.count_lines(block) + 1
    label = np.empty(capacity, np.int8)
    dense = np.empty((len(layout.dense), capacity), np.float32)
    sparse = np.empty((len(layout.sparse), capacity), np.int64)
    missing = np.empty(capacity, np.uint64)
    rows, bad = _fastparse.parse_block(
        block, layout.sep, layout.kinds, layout.sizes, layout.fills, layout.transforms,
        layout.lows, layout.highs, capacity, label, dense, sparse, missing)
    return _Parsed(rows, bad, label[:rows], dense[:, :rows], sparse[:, :rows], missing[:rows])


class _Writer:
    """One thread that encodes and writes row groups, in submission order, a few behind."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1)
        self.pending: deque[Any] = deque()

    def submit(self, fn: Any, *args: Any) -> None:
        self.pending.append(self.pool.submit(fn, *args))
        while len(self.pending) > WRITES_AHEAD:
            self.pending.popleft().result()

    def drain(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    def shutdown(self) -> None:
        for future in self.pending:
            future.cancel()
        self.pool.shutdown(wait=True)


@dataclass
class _SplitSink:
    """Rows of one split, buffered into row groups of exactly ``row_group_size``.

    Parsed columns become Arrow arrays without a copy; a row group is a zero-copy slice of
    the buffered pieces, encoded and written on the writer thread.
    """

    path: Path
    layout: FastLayout
    row_group_size: int
    compression: str
    writes: _Writer
    pieces: list[pa.Table] = field(default_factory=list)
    buffered: int = 0
    writer: pq.ParquetWriter | None = None

    def add(self, piece: _Parsed) -> None:
        layout = self.layout
        # With the type given, pa.array wraps the numpy buffer (no type inference, no copy).
        columns = [pa.array(piece.label, type=pa.int8())]
        columns += [pa.array(piece.dense[j], type=pa.float32()) for j in range(len(layout.dense))]
        columns += [pa.array(piece.sparse[j], type=pa.int64())
                    for j in range(len(layout.sparse))]
        self.pieces.append(pa.Table.from_arrays(columns, schema=layout.arrow_schema()))
        self.buffered += piece.rows
        while self.buffered >= self.row_group_size:
            self._write(self.row_group_size)

    def close(self) -> None:
        if self.buffered:
            self._write(self.buffered)
        self.writes.drain()
        if self.writer is not None:
            self.writer.close()

    def _write(self, rows: int) -> None:
        if self.writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Dictionaries pay for the ids (repeats) but not for the dense floats.
            self.writer = pq.ParquetWriter(
                self.path, self.layout.arrow_schema(), compression=self.compression,
                use_dictionary=[self.layout.label, *self.layout.sparse])
        table = pa.concat_tables(self.pieces)
        self.writes.submit(self.writer.write_table, table.slice(0, rows), rows)
        self.buffered -= rows
        self.pieces = [table.slice(rows)] if self.buffered else []


def _assign(rule: SplitRule, start: int, rows: int) -> np.ndarray | str:
    """The split of rows ``start .. start + rows``: one name for all, or codes 0/1/2."""
    kind = rule[0]
    if kind == "literal":
        return str(rule[1])
    index = np.arange(start, start + rows, dtype=np.uint64)
    if kind == "halves":
        return np.where(index < np.uint64(rule[1]), 1, 2).astype(np.int8)
    (train, val), stream, seed = rule[1], rule[2], rule[3]
    u = random_unit_numpy(index, stream, seed)
    return np.where(u < train, 0, np.where(u < train + val, 1, 2)).astype(np.int8)


def stream_fast(
    layout: FastLayout,
    path: Path,
    header_lines: int,
    rule: SplitRule,
    paths: Mapping[str, Path],
    row_group_size: int,
    compression: str,
    progress: Progress,
    block_bytes: int = BLOCK_BYTES,
) -> dict[str, dict[str, Any]] | None:
    """Parse ``path`` into the Parquet files ``paths`` (split -> file); per-split counts.

    Returns None, having removed every file it wrote, when a row is not certainly well
    formed: the caller then runs the general path over the whole input.
    """
    collecting = gc.isenabled()
    gc.disable()  # the cycle collector would walk every object per block, for nothing
    writes = _Writer()
    sinks = {s: _SplitSink(p, layout, row_group_size, compression, writes)
             for s, p in paths.items()}
    counts = {s: _empty_counts(layout) for s in paths}
    started = 0
    try:
        with ThreadPoolExecutor(THREADS) as pool:
            pending: deque[Any] = deque()
            blocks = _blocks(path, header_lines, block_bytes)
            ok = True
            for block in blocks:
                pending.append(pool.submit(_parse, block, layout))
                if len(pending) > LOOKAHEAD:
                    parsed = pending.popleft().result()
                    ok = _take(parsed, rule, started, sinks, counts, progress)
                    started += parsed.rows
                    if not ok:
                        break
            while ok and pending:
                parsed = pending.popleft().result()
                ok = _take(parsed, rule, started, sinks, counts, progress)
                started += parsed.rows
            for future in pending:
                future.cancel()
        for sink in sinks.values():
            sink.close() if ok else _discard(sink)
    except BaseException:
        for sink in sinks.values():
            _discard(sink)
        raise
    finally:
        writes.shutdown()
        if collecting:
            gc.enable()
    return counts if ok else None


def _discard(sink: _SplitSink) -> None:
    sink.writes.shutdown()
    if sink.writer is not None:
        sink.writer.close()
    sink.path.unlink(missing_ok=True)


class SplitSummary:
    """What the manifest says about a split's features, gathered while it is written.

    Dense columns: sum, sum of squares (float64), min and max; sparse columns: a HyperLogLog
    sketch of the ids. It spares reading a large split back; on small data the manifest
    still counts exactly from the written files (``ctrctl.data.stats``).
    """

    def __init__(self, dense: tuple[str, ...], sparse: tuple[str, ...]):
        self.dense, self.sparse = dense, sparse
        self.rows = 0
        self.sum = np.zeros(len(dense))
        self.sumsq = np.zeros(len(dense))
        self.min = np.full(len(dense), np.inf)
        self.max = np.full(len(dense), -np.inf)
        self.registers = np.zeros((len(sparse), 1 << HLL_BITS), np.uint8)

    def add(self, piece: _Parsed) -> None:
        if piece.rows == 0:
            return
        self.rows += piece.rows
        values = piece.dense.astype(np.float64)
        np.minimum(self.min, values.min(axis=1), out=self.min)
        np.maximum(self.max, values.max(axis=1), out=self.max)
        self.sum += values.sum(axis=1)
        # Squares in place, no BLAS (whose idle threads spin and burn the other core).
        self.sumsq += np.multiply(values, values, out=values).sum(axis=1)
        assert _fastparse is not None
        for j in range(len(self.sparse)):
            _fastparse.hll_add(self.registers[j], piece.sparse[j], HLL_BITS)

    def merge(self, other: SplitSummary) -> SplitSummary:
        """Both summaries together (a split fed by several inputs)."""
        out = SplitSummary(self.dense, self.sparse)
        out.rows = self.rows + other.rows
        out.sum, out.sumsq = self.sum + other.sum, self.sumsq + other.sumsq
        out.min, out.max = np.minimum(self.min, other.min), np.maximum(self.max, other.max)
        out.registers = np.maximum(self.registers, other.registers)
        return out

    def dense_stats(self) -> dict[str, tuple[float, float, float, float]]:
        """Column -> (mean, std with ddof 0, min, max)."""
        rows = max(self.rows, 1)
        mean = self.sum / rows
        std = np.sqrt(np.maximum(self.sumsq / rows - mean * mean, 0.0))
        return {n: (float(mean[j]), float(std[j]), float(self.min[j]), float(self.max[j]))
                for j, n in enumerate(self.dense)}

    def cardinalities(self) -> dict[str, int]:
        """Column -> estimated distinct ids (HyperLogLog with linear counting when small)."""
        m = 1 << HLL_BITS
        alpha = 0.7213 / (1 + 1.079 / m)
        out = {}
        for j, name in enumerate(self.sparse):
            registers = self.registers[j]
            estimate = alpha * m * m / float(np.sum(np.exp2(-registers.astype(np.float64))))
            zeros = int(np.count_nonzero(registers == 0))
            if estimate <= 2.5 * m and zeros:
                estimate = m * np.log(m / zeros)
            out[name] = int(round(estimate))
        return out


def _empty_counts(layout: FastLayout) -> dict[str, Any]:
    counts: dict[str, Any] = {"rows_read": 0, "rows": 0, "positives": 0, "first_bad": None}
    counts.update({reason: 0 for reason in BAD_REASONS})
    counts.update({f"__missing.{name}": 0 for name in layout.dense})
    counts[SUMMARY] = SplitSummary(layout.dense, layout.sparse)
    return counts


def _take(parsed: _Parsed, rule: SplitRule, start: int, sinks: Mapping[str, _SplitSink],
          counts: Mapping[str, dict[str, Any]], progress: Progress) -> bool:
    if parsed.bad >= 0:
        return False
    progress.advance(parsed.rows)
    split = _assign(rule, start, parsed.rows)
    if isinstance(split, str):
        _count(parsed, counts[split], sinks[split].layout)
        sinks[split].add(parsed)
        return True
    for code, name in enumerate(SPLIT_NAMES):
        if name not in sinks:
            continue
        rows = np.flatnonzero(split == code)
        if len(rows) == 0:
            continue
        # np.take keeps each column contiguous (the C sketch and Arrow want that).
        piece = _Parsed(len(rows), -1, parsed.label[rows], np.take(parsed.dense, rows, axis=1),
                        np.take(parsed.sparse, rows, axis=1), parsed.missing[rows])
        _count(piece, counts[name], sinks[name].layout)
        sinks[name].add(piece)
    return True


def _count(piece: _Parsed, counts: dict[str, Any], layout: FastLayout) -> None:
    counts["rows_read"] += piece.rows
    counts["rows"] += piece.rows
    counts["positives"] += int(piece.label.sum(dtype=np.int64))
    counts[SUMMARY].add(piece)
    if piece.rows and piece.missing.any():
        for j, name in enumerate(layout.dense):
            counts[f"__missing.{name}"] += int(np.count_nonzero(piece.missing & np.uint64(1 << j)))
