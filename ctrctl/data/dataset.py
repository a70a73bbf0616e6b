"""Parquet splits of a preprocessed dataset -> :class:`~ctrctl.data.batch.Batch` es.

How the rows of a split reach a rank
------------------------------------
The split's rows, in file order, are numbered ``0..N-1``. Over ``W`` ranks:

* training (``cover_all=False``): every rank gets exactly ``N // W`` rows, rank ``r`` the range
  starting at ``r * N // W`` (at most ``W - 1`` rows of the split go unused). With the same
  row count on every rank, every rank has the same number of batches per epoch, so no rank
  waits on a collective that the others never reach.
* scoring (``cover_all=True``): rank ``r`` gets rows ``[r*N//W, (r+1)*N//W)``, which together
  cover every row once; batch counts may then differ by one between ranks.

The batch size given is the global batch ``B``; each rank yields ``B // W`` rows per step
(``B`` must be a multiple of ``W``).

With ``global_order=True`` (training only) every rank instead reads the whole split in the
order of one process (``W = 1``, rank 0, same seed) and keeps rows ``[r*n//W, (r+1)*n//W)``
of each global batch of ``n`` rows: ``W`` processes then train on exactly the batches of one
process, at ``W`` times the reading cost.

Shuffling, and why resume is exact
----------------------------------
A rank's rows fall into *chunks* (a row group clipped to the rank's range). Each epoch the
chunk order is shuffled, consecutive chunks are gathered into *windows* of at least
``shuffle_buffer`` rows, and each window's rows are permuted. Batches are consecutive rows of
that stream, crossing window boundaries freely. Every order depends only on (seed, epoch,
rank, window), so batch ``k`` of epoch ``e`` is a pure function of the dataset and those
numbers: the trainer stores ``(epoch, batch)`` and :meth:`BatchLoader.epoch` starts there.

Reading
-------
Background threads read whole windows with pyarrow (which releases the GIL while decoding),
convert each column to numpy once, and a producer thread cuts batches: dense rows are a
slice of a (rows, D) float32 array, and one-hot sparse ids a slice of a feature-major
(F, rows) int64 array, which flattens straight into the KeyedJaggedTensor's key-major values.

Example:
    >>> loader = BatchLoader("dataset", "train", batch_size=4096, seed=0)
    >>> for batch in loader.epoch(0):
    ...     logits = model(batch.dense, batch.sparse)
    >>> scoring = BatchLoader.for_scoring("dataset", "test", batch_size=8192)
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from ctrctl.data.batch import Batch
from ctrctl.data.blocks import Block, take_multihot
from ctrctl.data.manifest import TIME_COLUMN, DatasetManifest
from ctrctl.errors import ConfigError, DatasetError
from ctrctl.sparse import KeyedJaggedTensor

__all__ = ["BatchLoader", "LoaderPosition"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoaderPosition:
    """Where a loader is: the next batch to yield is ``batch`` of ``epoch``."""

    epoch: int = 0
    batch: int = 0


@dataclass(frozen=True)
class _Chunk:
    """Rows ``[start, stop)`` of row group ``row_group`` of file ``file``."""

    file: int
    row_group: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def _id_error(feature: str, value: int, size: int, where: str) -> DatasetError:
    return DatasetError(
        f"feature {feature!r} has id {value:,}, outside its table of {size:,} rows",
        where=where,
        hint="the manifest does not describe these files; re-run `ctrctl preprocess` "
             "rather than editing manifest.json")


class BatchLoader:
    """Batches of one split of a dataset for one rank.

    Args:
        dataset: the dataset folder (``manifest.json`` + Parquet splits).
        split: ``train``, ``val`` or ``test``.
        batch_size: the global batch; each of ``world_size`` ranks yields
            ``batch_size // world_size`` rows per batch.
        rank, world_size: this rank and the number of ranks.
        shuffle: shuffle chunk order and rows within windows, per epoch.
        seed: the shuffling seed (with the epoch and rank).
        shuffle_buffer: rows gathered into one window before permuting.
        drop_last: drop a final partial batch.
        cover_all: give ranks ranges covering every row (scoring) rather than equal ranges
            (training); see the module docstring.
        num_workers: threads decoding windows (0: decode in the calling thread).
        prefetch: ready batches kept ahead of the consumer.
        max_rows: use at most this many rows of the split (the first ones in file order).
        pin_memory: put batches in page-locked memory (in the producer thread), for
            asynchronous copies to a GPU.
        global_order: read the split in the one-process order (``world_size=1``, rank 0) and
            yield this rank's slice ``[r*n//W, (r+1)*n//W)`` of each global batch of ``n``
            rows, so ``W`` ranks together see exactly the batches of one process.

    Raises:
        DatasetError: a missing split, file or column, or a column of the wrong type.
        ConfigError: a batch size that the world size does not divide.
    """

    def __init__(
        self,
        dataset: str | Path,
        split: str,
        batch_size: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 262_144,
        drop_last: bool = False,
        cover_all: bool = False,
        num_workers: int = 2,
        prefetch: int = 4,
        max_rows: int | None = None,
        manifest: DatasetManifest | None = None,
        pin_memory: bool = False,
        global_order: bool = False,
    ) -> None:
        self.path = Path(dataset)
        self.manifest = manifest or DatasetManifest.load(self.path)
        self.split = split
        if batch_size <= 0 or batch_size % world_size:
            raise ConfigError(
                f"batch size {batch_size} does not split over {world_size} ranks",
                where="training.batch_size",
                hint=f"use a multiple of {world_size}",
            )
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside the world of {world_size}")
        self.global_batch_size = batch_size
        self.batch_size = batch_size // world_size
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.seed, self.shuffle_buffer = shuffle, seed, max(1, shuffle_buffer)
        self.drop_last, self.cover_all = drop_last, cover_all
        self.num_workers, self.prefetch = num_workers, max(1, prefetch)
        self.pin_memory = pin_memory and torch.cuda.is_available()

        self.keys = self.manifest.sparse_names
        self._multi_hot = {f.name for f in self.manifest.sparse if f.multi_hot}
        self._onehot_keys = [k for k in self.keys if k not in self._multi_hot]
        self._multihot_keys = [k for k in self.keys if k in self._multi_hot]
        self._columns = [self.manifest.label, *self.manifest.dense_names, *self.keys]
        self._time = self.manifest.needs_time  # ttl tables evict by each row's time
        if self._time:
            self._columns.append(TIME_COLUMN)
        self.files = self._split_files()
        self._unchecked: set[str] = set()
        self._sizes = self.manifest.table_sizes()
        self._raw_keys = {f.name for f in self.manifest.sparse if f.mode == "zch"}  # any int64
        total = self._open_and_check()
        if max_rows is not None:
            total = min(total, max_rows)
        self.split_rows = total
        self.global_order = global_order
        # The stream batches are cut from: this rank's rows in batches of B // W, or (global
        # order) the whole split in batches of B, shuffled with the keys of rank 0 of one.
        self._stream_rank = 0 if global_order else rank
        self._stream_batch = batch_size if global_order else self.batch_size
        if global_order:
            start, stop = 0, total
        elif cover_all:
            start, stop = rank * total // world_size, (rank + 1) * total // world_size
        else:
            start = rank * total // world_size
            stop = start + total // world_size
        self._stream_rows = stop - start
        self.rows = total // world_size if global_order else stop - start
        self._chunks = self._make_chunks(start, stop)
        self._ones_cache: dict[int, torch.Tensor] = {}

    # ---- construction helpers -------------------------------------------------------
    @classmethod
    def for_scoring(
        cls, dataset: str | Path, split: str, batch_size: int = 8192, *, rank: int = 0,
        world_size: int = 1, num_workers: int = 2, max_rows: int | None = None,
    ) -> BatchLoader:
        """In file order, not shuffled, every row once over the ranks, last batch kept.

        ``batch_size`` here is per rank (scoring needs no global batch).
        """
        return cls(dataset, split, batch_size * world_size, rank=rank, world_size=world_size,
                   shuffle=False, drop_last=False, cover_all=True, num_workers=num_workers,
                   max_rows=max_rows)

    def _split_files(self) -> list[Path]:
        info = self.manifest.split(self.split)
        if info.files:
            files = [self.path / f for f in info.files]
        else:
            files = sorted((self.path / self.split).glob("*.parquet"))
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise DatasetError(f"split {self.split!r} lists missing files: {missing[:3]}",
                               where=str(self.path), hint="re-run `ctrctl preprocess`")
        if not files:
            raise DatasetError(f"split {self.split!r} has no Parquet files",
                               where=str(self.path / self.split))
        return files

    def _open_and_check(self) -> int:
        self._row_groups: list[list[int]] = []
        total = 0
        for path in self.files:
            try:
                meta = pq.ParquetFile(path)
            except (pa.ArrowException, OSError) as exc:
                raise DatasetError(f"not a readable Parquet file ({exc})", where=str(path),
                                   hint="re-run `ctrctl preprocess` to write it again") from None
            schema = meta.schema_arrow
            for name in self._columns:
                if name not in schema.names:
                    raise DatasetError(
                        f"column {name!r} is missing", where=str(path),
                        hint="preprocess again: ttl tables need each row's data time"
                        if name == TIME_COLUMN else "the manifest and the Parquet files disagree")
                kind = schema.field(name).type
                want_list = name in self._multi_hot
                ok = (
                    pa.types.is_list(kind) or pa.types.is_large_list(kind)
                    if want_list
                    else not (pa.types.is_list(kind) or pa.types.is_large_list(kind))
                )
                if not ok:
                    raise DatasetError(
                        f"column {name!r} has type {kind}, expected "
                        f"{'a list of ids' if want_list else 'one value per row'}",
                        where=str(path),
                    )
            self._check_id_ranges(path, meta)
            counts = [meta.metadata.row_group(i).num_rows for i in range(meta.num_row_groups)]
            self._row_groups.append(counts)
            total += sum(counts)
        return total

    def _check_id_ranges(self, path: Path, meta: pq.ParquetFile) -> None:
        """Every sparse id within its table, from the row groups' min/max statistics.

        A manifest out of step with its data would otherwise train on wrong rows silently
        (FBGEMM maps an out-of-range id to row 0). Columns written without statistics are
        checked when their rows are decoded instead.
        """
        sizes = self._sizes
        leaf = {meta.schema.column(i).path.split(".")[0]: i for i in range(meta.metadata.num_columns)}
        for name in self.keys:
            if name in self._raw_keys:
                continue
            column = leaf.get(name)
            for group in range(meta.num_row_groups):
                stats = None if column is None else (
                    meta.metadata.row_group(group).column(column).statistics)
                if stats is None or not stats.has_min_max:
                    self._unchecked.add(name)
                    continue
                low, high = int(stats.min), int(stats.max)
                if low < 0 or high >= sizes[name]:
                    raise _id_error(name, low if low < 0 else high, sizes[name],
                                    f"{path} (row group {group})")

    def _make_chunks(self, start: int, stop: int) -> list[_Chunk]:
        chunks = []
        offset = 0
        for f, counts in enumerate(self._row_groups):
            for g, n in enumerate(counts):
                lo, hi = max(start, offset), min(stop, offset + n)
                if lo < hi:
                    chunks.append(_Chunk(f, g, lo - offset, hi - offset))
                offset += n
        return chunks

    # ---- sizes ------------------------------------------------------------------------
    @property
    def num_batches(self) -> int:
        """Batches per epoch on this rank (the same on every rank unless ``cover_all``)."""
        if self.drop_last:
            return self._stream_rows // self._stream_batch
        return -(-self._stream_rows // self._stream_batch)

    def __len__(self) -> int:
        return self.num_batches

    # ---- the epoch's order ----------------------------------------------------------
    def _windows(self, epoch: int) -> list[list[_Chunk]]:
        order = list(range(len(self._chunks)))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch, self._stream_rank]).permutation(
                len(self._chunks)).tolist()
        windows: list[list[_Chunk]] = []
        current: list[_Chunk] = []
        rows = 0
        for i in order:
            current.append(self._chunks[i])
            rows += self._chunks[i].rows
            if rows >= self.shuffle_buffer or not self.shuffle:
                windows.append(current)
                current, rows = [], 0
        if current:
            windows.append(current)
        return windows

    def _read_window(self, epoch: int, index: int, chunks: list[_Chunk]) -> Block:
        tables = []
        handles: dict[int, pq.ParquetFile] = {}
        for c in chunks:
            if c.file not in handles:
                handles[c.file] = pq.ParquetFile(self.files[c.file], memory_map=True)
            table = handles[c.file].read_row_group(c.row_group, columns=self._columns,
                                                   use_threads=False)
            tables.append(table.slice(c.start, c.rows))
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        perm = None
        if self.shuffle:
            perm = np.random.default_rng([self.seed, epoch, self._stream_rank, index, 1]).permutation(
                table.num_rows)
        return self._decode(table, perm)

    def _decode(self, table: pa.Table, perm: np.ndarray | None) -> Block:
        """Columns to numpy, rows in ``perm`` order (gathered while converting: one pass)."""
        n = table.num_rows

        def gathered(name: str) -> np.ndarray:
            values = table.column(name).to_numpy()
            return values if perm is None else np.take(values, perm)

        labels = gathered(self.manifest.label).astype(np.float32)
        dense = np.empty((n, len(self.manifest.dense_names)), dtype=np.float32)
        for j, name in enumerate(self.manifest.dense_names):
            dense[:, j] = gathered(name)
        onehot = np.empty((len(self._onehot_keys), n), dtype=np.int64)
        for j, name in enumerate(self._onehot_keys):
            values = table.column(name).to_numpy()
            if name in self._unchecked:
                self._check_values(name, values)
            if perm is None:
                onehot[j] = values
            else:
                np.take(values, perm, out=onehot[j])
        multihot = []
        for name in self._multihot_keys:
            column = table.column(name).combine_chunks()
            if column.null_count:
                column = column.fill_null(pa.scalar([], column.type))
            offsets = column.offsets.to_numpy().astype(np.int64)
            values = column.values.to_numpy().astype(np.int64)
            values = values[offsets[0]:offsets[-1]]
            if name in self._unchecked:
                self._check_values(name, values)
            offsets = offsets - offsets[0]
            multihot.append((np.diff(offsets), offsets, values))
        if multihot and perm is not None:
            multihot = take_multihot(multihot, perm)
        time = gathered(TIME_COLUMN).astype(np.float64) if self._time else None
        return Block(labels, dense, onehot, multihot, time)

    def _check_values(self, name: str, values: np.ndarray) -> None:
        if values.size == 0 or name in self._raw_keys:
            return
        size = self._sizes[name]
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= size:
            raise _id_error(name, low if low < 0 else high, size, f"split {self.split!r}")

    # ---- batches ------------------------------------------------------------------------
    def _ones(self, n: int) -> torch.Tensor:
        # One-hot lengths are all ones; made once per size (read-only by every consumer).
        cached = self._ones_cache.get(n)
        if cached is None:
            cached = self._ones_cache[n] = torch.from_numpy(np.ones(n, dtype=np.int32))
        return cached

    def _to_batch(self, block: Block) -> Batch:
        if self.global_order:
            n, r, w = block.rows, self.rank, self.world_size
            block = block.slice(r * n // w, (r + 1) * n // w)
        b = block.rows
        if not block.multihot:
            values = torch.from_numpy(np.ascontiguousarray(block.onehot).reshape(-1))
            lengths = self._ones(len(self.keys) * b)
        else:
            parts, length_parts = [], []
            onehot_index = {k: i for i, k in enumerate(self._onehot_keys)}
            multihot_index = {k: i for i, k in enumerate(self._multihot_keys)}
            for key in self.keys:
                if key in onehot_index:
                    parts.append(block.onehot[onehot_index[key]])
                    length_parts.append(np.ones(b, dtype=np.int32))
                else:
                    bag_lengths, _, vals = block.multihot[multihot_index[key]]
                    parts.append(vals)
                    length_parts.append(bag_lengths.astype(np.int32))
            values = torch.from_numpy(np.concatenate(parts) if parts else np.empty(0, np.int64))
            lengths = torch.from_numpy(np.concatenate(length_parts) if length_parts
                                       else np.empty(0, np.int32))
        sparse = KeyedJaggedTensor(self.keys, values, lengths=lengths, stride=b)
        batch = Batch(dense=torch.from_numpy(block.dense), sparse=sparse,
                      labels=torch.from_numpy(block.labels),
                      time=None if block.time is None else torch.from_numpy(block.time))
        return batch.pin_memory() if self.pin_memory else batch

    def _blocks(self, epoch: int, start_row: int) -> Iterator[Block]:
        """The epoch's rows from ``start_row`` on, as window blocks, read ahead in threads."""
        windows = self._windows(epoch)
        first, skip = 0, start_row
        while first < len(windows) and skip >= sum(c.rows for c in windows[first]):
            skip -= sum(c.rows for c in windows[first])
            first += 1
        todo = list(range(first, len(windows)))
        if self.num_workers == 0:
            for i in todo:
                block = self._read_window(epoch, i, windows[i])
                yield block.slice(skip, block.rows) if skip else block
                skip = 0
            return
        with ThreadPoolExecutor(self.num_workers, thread_name_prefix="ctrctl-read") as pool:
            pending: list[Future[Block]] = []
            ahead = self.num_workers + 1
            try:
                for i in todo:
                    pending.append(pool.submit(self._read_window, epoch, i, windows[i]))
                    if len(pending) >= ahead:
                        block = pending.pop(0).result()
                        yield block.slice(skip, block.rows) if skip else block
                        skip = 0
                while pending:
                    block = pending.pop(0).result()
                    yield block.slice(skip, block.rows) if skip else block
                    skip = 0
            finally:
                for future in pending:
                    future.cancel()

    def _batches(self, epoch: int, start_batch: int) -> Iterator[Batch]:
        b = self._stream_batch
        remaining = self.num_batches - start_batch
        carry: list[Block] = []
        carried = 0
        if remaining <= 0:
            return
        for block in self._blocks(epoch, start_batch * b):
            pos = 0
            if carried:
                need = b - carried
                if block.rows < need:
                    carry.append(block)
                    carried += block.rows
                    continue
                carry.append(block.slice(0, need))
                yield self._to_batch(Block.concat(carry))
                carry, carried, pos = [], 0, need
                remaining -= 1
                if remaining == 0:
                    return
            while block.rows - pos >= b:
                yield self._to_batch(block.slice(pos, pos + b))
                pos += b
                remaining -= 1
                if remaining == 0:
                    return
            if pos < block.rows:
                carry.append(block.slice(pos, block.rows))
                carried += block.rows - pos
        if carried and remaining > 0 and not self.drop_last:
            yield self._to_batch(Block.concat(carry))

    def epoch(self, epoch: int = 0, start_batch: int = 0) -> Generator[Batch, None, None]:
        """The batches of ``epoch`` from batch ``start_batch`` on.

        Batches are produced by a background thread ``prefetch`` ahead of the consumer;
        leaving the loop early stops it.

        Args:
            epoch: the epoch (seeds the shuffle with the loader's seed and rank).
            start_batch: skip this many batches (resume); the rest are exactly those an
                uninterrupted pass would have yielded.
        """
        if self.num_workers == 0:
            yield from self._batches(epoch, start_batch)
            return
        ready: queue.Queue[object] = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        done = object()

        def produce() -> None:
            try:
                for batch in self._batches(epoch, start_batch):
                    while not stop.is_set():
                        try:
                            ready.put(batch, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                ready.put(done)
            except BaseException as exc:  # handed to the consumer, raised there
                ready.put(exc)

        thread = threading.Thread(target=produce, name="ctrctl-batches", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            stop.set()
            while thread.is_alive():
                try:
                    ready.get_nowait()
                except queue.Empty:
                    thread.join(timeout=0.05)

    def __iter__(self) -> Iterator[Batch]:
        return self.epoch(0)
