"""A table on disk and a set-associative DRAM cache of its hot rows.

The whole table (weights and the fused optimizer's per-row state) lives in memory-mapped
files (:class:`RowFile`). Their blocks are reserved when they are created (a mapped write to
a full disk would be a SIGBUS; a checkpoint writes the whole table anyway), and their sizes
are checked before rows are read or written (a file truncated under its mapping would be
too). A row that was never written is initialised on demand from ``(table seed, row id)``
by :func:`hashed_uniform`, so an in-memory reference table built with the same rule starts
from the same bits.

:class:`SetAssociativeRowCache` keeps ``ways`` (32) slots per set; row ``r`` lives in set
``r % num_sets``, and a set replaces its least recently used unlocked slot::

    set s:  way 0  way 1 ... way 31      slot = s * ways + way
    tag     row    row       -1 (empty)   lock: batches in flight that use the slot
    used    clock  clock     -1           dirty: updated since read from the file

A lookup (:meth:`SetAssociativeRowCache.lookup_and_lock`) takes a batch's distinct ids:
hits keep their slot; misses take, per set and in ascending id order, the free (unlocked)
slots in order (empty first, then oldest ``used``, then lowest way); dirty victims are written
back first, then the misses are read. A miss whose set has no unlocked slot left (every way
held by batches in flight) is a *conflict miss*: it gets a slot in an overflow area, outside
the sets, that lives until the last batch using it releases it and is then written back.
Every slot a lookup returns is locked until :meth:`release`.

Example:
    >>> store = RowFile(tmp_path, "t", rows=1000, dim=8, state_shapes={"momentum1": ()},
    ...                 seed=7, init_range=(-0.03, 0.03))
    >>> cache = SetAssociativeRowCache(store, load_factor=0.1)
    >>> slots = cache.lookup_and_lock(np.array([3, 17, 999]))
    >>> cache.weight[slots]                      # the rows' weights, (3, 8)
    >>> cache.release(slots)
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import mmap
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from ctrctl.errors import CtrctlError, OutputLocationError

__all__ = ["CacheCounters", "RowFile", "SetAssociativeRowCache", "hashed_uniform"]

WAYS = 32
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
#: Bytes of file pages touched after which the mappings drop their resident pages.
#: (The pages mapped never exceed the files' size: tables whose files are smaller never trim,
#: and re-faulting every page after a trim costs ~2x the write-back time of a step.)
_TRIM_BYTES = 512 << 20
_PAGE = mmap.PAGESIZE
#: Rows read or written per step, so that at most ~_TRIM_BYTES of file pages stay mapped.
_CHUNK = 8192


class CacheError(CtrctlError):
    """The cache was used out of order (e.g. flushed while batches hold rows)."""


def hashed_uniform(
    seed: int, rows: np.ndarray, dim: int, low: float, high: float,
    col_offset: int = 0, full_dim: int | None = None,
) -> np.ndarray:
    """Initial weights of ``rows``: uniform in [low, high), a pure function of (seed, row, col).

    splitmix64 of ``seed``, row and column, top 24 bits as a float in [0, 1). The same rows
    give the same bits whatever else is asked with them, so a cached table and an in-memory
    one built with this rule start identical.

    Args:
        seed: the table's seed.
        rows: (n,) int64 row ids.
        dim: columns.
        low, high: the range.
        col_offset, full_dim: columns ``col_offset .. col_offset + dim`` of a table
            ``full_dim`` wide (a column block of a sharded table gets the whole table's bits).

    Returns:
        (n, dim) float32.
    """
    r = rows.astype(np.uint64).reshape(-1, 1)
    cols = np.arange(col_offset, col_offset + dim, dtype=np.uint64).reshape(1, -1)
    z = (r * np.uint64(full_dim or dim) + cols) ^ np.uint64((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    unit = (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    return np.float32(low) + np.float32(high - low) * unit


def _disk_error(path: Path, exc: OSError, nbytes: int) -> OutputLocationError:
    """One line for a cache file that cannot be created or reserved (full, read-only)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputLocationError(
            f"no room for the cached table's file ({nbytes:,} bytes): {exc.strerror}",
            where=str(path), hint="free disk space, or point model.cache_dir at a disk with "
                                  "room for every cached table")
    return OutputLocationError(f"cannot write the cached table's file: {exc.strerror}",
                               where=str(path),
                               hint="point model.cache_dir at a writable folder")


def _reserved_file(path: Path, nbytes: int) -> BinaryIO:
    """Create ``path`` of ``nbytes`` with every block reserved, open for reading and writing.

    A sparse file whose disk fills up cannot take a page written through its mapping: the
    process dies of SIGBUS, with no message. ``posix_fallocate`` reserves the blocks now, so
    a full disk is one :class:`OutputLocationError` before training (a checkpoint writes the
    whole table anyway). Where the file system cannot reserve (EOPNOTSUPP, EINVAL), the
    file stays sparse.
    """
    nbytes = max(nbytes, 1)
    try:
        handle = open(path, "w+b")  # noqa: SIM115  (kept open: its size is checked later)
    except OSError as exc:
        raise _disk_error(path, exc, nbytes) from None
    try:
        handle.truncate(nbytes)
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(handle.fileno(), 0, nbytes)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
    except OSError as exc:
        handle.close()
        path.unlink(missing_ok=True)
        raise _disk_error(path, exc, nbytes) from None
    return handle


class RowFile:
    """One table's weights and optimizer state in memory-mapped files (blocks reserved).

    Args:
        directory: where the files go (created; one ``<name>.<part>.f32`` per tensor).
        name: the table's name.
        rows, dim: the table's shape.
        state_shapes: per optimizer state tensor, its shape per row (``()`` for one float a
            row, ``(dim,)`` for one per element); zeros initially.
        seed, init_range: the (seed, row id) initialisation of untouched rows.
        block: (row offset, column offset, full dim) when this file holds one block of a
            larger table (a shard): untouched rows start as that table's rows would.
    """

    def __init__(
        self,
        directory: Path,
        name: str,
        rows: int,
        dim: int,
        state_shapes: Mapping[str, tuple[int, ...]],
        seed: int,
        init_range: tuple[float, float],
        block: tuple[int, int, int] | None = None,
    ) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _disk_error(directory, exc, 0) from None
        self.block = block or (0, 0, int(dim))
        self.rows, self.dim, self.seed = int(rows), int(dim), int(seed)
        self.init_range = (float(init_range[0]), float(init_range[1]))
        self.state_shapes = {k: tuple(v) for k, v in state_shapes.items()}
        self.paths: list[Path] = []
        self._maps: list[mmap.mmap] = []
        self._files: list[tuple[BinaryIO, int]] = []  # (open file, its size), checked
        try:
            self.weight = self._map(directory / f"{name}.weight.f32", (self.rows, self.dim))
            self.states = {
                k: self._map(directory / f"{name}.{k}.f32", (self.rows, *shape))
                for k, shape in self.state_shapes.items()
            }
        except BaseException:
            self.close()  # no partial cache files left behind
            raise
        self.touched = np.zeros(self.rows, dtype=bool)  # written to the file at least once
        self.row_bytes = 4 * (self.dim + sum(math.prod(s) for s in self.state_shapes.values()))
        self.file_bytes = self.rows * self.row_bytes
        self._since_trim = 0

    def _map(self, path: Path, shape: tuple[int, ...]) -> np.ndarray:
        nbytes = 4 * math.prod(shape)
        handle = _reserved_file(path, nbytes)
        self.paths.append(path)
        self._files.append((handle, max(nbytes, 1)))
        self.check()
        mapped = mmap.mmap(handle.fileno(), max(nbytes, 1))
        self._maps.append(mapped)
        return np.frombuffer(mapped, dtype=np.float32, count=math.prod(shape)).reshape(shape)

    def check(self) -> None:
        """:class:`OutputLocationError` naming a file shorter than its mapping.

        Touching a mapped page past a file's end kills the process with SIGBUS, no message:
        each read and write of rows looks at the sizes first (an ``fstat`` per file, on the
        open file, so a deleted file still counts as whole).
        """
        for (handle, nbytes), path in zip(self._files, self.paths, strict=True):
            size = os.fstat(handle.fileno()).st_size
            if size < nbytes:
                raise OutputLocationError(
                    f"the cached table's file is {size:,} bytes where {nbytes:,} are mapped: "
                    "it was truncated while in use", where=str(path),
                    hint="leave model.cache_dir alone while training, and train again")

    def initial(self, ids: np.ndarray) -> np.ndarray:
        """(n, dim) initial weights of ``ids``."""
        row_offset, col_offset, full_dim = self.block
        return hashed_uniform(self.seed, ids + row_offset if row_offset else ids, self.dim,
                              *self.init_range, col_offset=col_offset, full_dim=full_dim)

    def read(self, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
        """Weights and states of ``ids``, and how many of them came from the file."""
        weight = self.initial(ids)
        states = {k: np.zeros((ids.size, *s), dtype=np.float32) for k, s in self.state_shapes.items()}
        where = np.nonzero(self.touched[ids])[0]
        if where.size:
            self.check()
        for start in range(0, where.size, _CHUNK):  # chunks: mapped pages are trimmed between
            part = where[start : start + _CHUNK]
            stored = ids[part]
            weight[part] = self.weight[stored]
            for k, array in self.states.items():
                states[k][part] = array[stored]
            self._count(stored.size)
        return weight, states, int(where.size)

    def write(self, ids: np.ndarray, weight: np.ndarray, states: Mapping[str, np.ndarray]) -> None:
        """Store rows ``ids`` (distinct)."""
        self.check()
        for start in range(0, ids.size, _CHUNK):
            part = slice(start, start + _CHUNK)
            self.weight[ids[part]] = weight[part]
            for k, array in self.states.items():
                array[ids[part]] = states[k][part]
            self.touched[ids[part]] = True
            self._count(ids[part].size)

    def _count(self, rows: int) -> None:
        # Pages of a shared file mapping count in the process's RSS while mapped; drop them
        # now and then (the data stays in the page cache and on disk). Rows far apart touch
        # a page each, in every file.
        self._since_trim = min(self._since_trim + rows * _PAGE * len(self._maps),
                               self.file_bytes)
        if self._since_trim > _TRIM_BYTES:
            self.trim()

    def trim(self) -> None:
        """Unmap the resident pages of the files from this process (contents are kept)."""
        self._since_trim = 0
        if hasattr(mmap, "MADV_DONTNEED"):
            for mapped in self._maps:
                mapped.madvise(mmap.MADV_DONTNEED)

    def materialize(self, chunk: int = 1 << 16) -> None:
        """Write the initial values of every untouched row, so the files hold the whole table."""
        self.check()
        for start in range(0, self.rows, chunk):
            ids = np.arange(start, min(start + chunk, self.rows))
            fresh = ids[~self.touched[ids]]
            if fresh.size:
                self.weight[fresh] = self.initial(fresh)
                for array in self.states.values():
                    array[fresh] = 0.0
                self.touched[fresh] = True

    def disk_bytes(self) -> int:
        """Bytes the files take on disk."""
        return sum(p.stat().st_blocks * 512 for p in self.paths if p.exists())

    def close(self) -> None:
        """Drop the mappings and delete the files."""
        self.weight = np.zeros((0, self.dim), dtype=np.float32)
        self.states = {}
        for mapped in self._maps:
            try:
                mapped.close()
            except BufferError:  # a view is still alive; the mapping goes with it
                pass
        self._maps = []
        for handle, _ in self._files:
            handle.close()
        self._files = []
        for p in self.paths:
            p.unlink(missing_ok=True)


@dataclasses.dataclass
class CacheCounters:
    """What a table's cache did (cumulative).

    ``unique_misses`` counts distinct ids of a lookup found in no slot, ``conflict_misses``
    those of them that found no free slot in their set. ``rows_written_back`` counts rows
    written to the file (dirty victims, released overflow rows, flushes); the byte counts are
    what went to and came from the file (untouched rows are initialised, not read).
    """

    calls: int = 0
    requested_ids: int = 0
    unique_ids: int = 0
    unique_misses: int = 0
    conflict_misses: int = 0
    rows_written_back: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Fill:
    """The data movement a lookup leaves for after its mutex: the tensors it chose slots in,
    the dirty victims (slots, the rows they held) and the misses (slots, rows)."""

    weight: torch.Tensor
    state: dict[str, torch.Tensor]
    evict: np.ndarray
    evicted_rows: np.ndarray
    miss_slots: np.ndarray
    miss_ids: np.ndarray


class SetAssociativeRowCache:
    """A DRAM cache of a :class:`RowFile`'s rows: ``ways``-way set-associative, LRU per set.

    Args:
        store: the table on disk.
        load_factor: slots as a share of the table's rows, rounded up to whole sets.
        ways: slots per set.

    Attributes:
        weight: (slots, dim) cached weights, read by the lookup and updated by the optimizer.
        state: the optimizer state of the cached rows, as :func:`init_state` shapes it.
        counters: :class:`CacheCounters`.
    """

    def __init__(self, store: RowFile, load_factor: float, ways: int = WAYS) -> None:
        if not 0 < load_factor <= 1:
            raise CacheError(
                f"cache_load_factor {load_factor} is not in (0, 1]",
                where="SetAssociativeRowCache",
                hint="give the share of rows to keep in memory, e.g. 0.2",
            )
        self.store, self.ways = store, int(ways)
        self.load_factor = float(load_factor)
        self.num_sets = max(1, min(math.ceil(load_factor * store.rows / ways),
                                   math.ceil(store.rows / ways)))
        self.main_slots = self.num_sets * self.ways
        self.weight = torch.zeros(self.main_slots, store.dim)
        self.state = {k: torch.zeros(self.main_slots, *s) for k, s in store.state_shapes.items()}
        self.slot_row = np.full(self.main_slots, -1, dtype=np.int64)
        self.last_used = np.full(self.main_slots, -1, dtype=np.int64)
        self.dirty = np.zeros(self.main_slots, dtype=bool)
        self.locks = np.zeros(self.main_slots, dtype=np.int32)
        self.overflow: dict[int, int] = {}  # row -> overflow slot
        self._free_overflow: list[int] = []
        self.counters = CacheCounters()
        self._clock = 0
        self._mutex = threading.Lock()

    # ---- sizes --------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Slots allocated: the sets' plus the overflow area's."""
        return int(self.weight.shape[0])

    def dram_bytes(self) -> int:
        """Memory the cache holds: slot rows, their metadata, and the file's touched map."""
        per_slot = self.store.row_bytes + 8 + 1 + 4 + 8  # row, slot_row, dirty, lock, used
        return self.capacity * per_slot + self.store.touched.nbytes

    def locked_slots(self) -> int:
        """Slots some batch in flight still holds."""
        return int((self.locks > 0).sum())

    # ---- lookups ------------------------------------------------------------------------

    def lookup_and_lock(self, ids: np.ndarray, requested: int | None = None) -> np.ndarray:
        """Slots of the distinct, ascending ``ids``, reading the misses; every slot is locked.

        Two phases: under the cache's mutex the slots are chosen and locked (metadata only);
        then, without it, the dirty victims are written back and the misses read into their
        slots. Those slots are locked by this lookup and held by no other batch, so a
        batch in flight may update its own (locked) rows meanwhile with :meth:`updating`.
        Lookups must not run concurrently with each other.

        Args:
            ids: (U,) distinct int64 row ids in ascending order.
            requested: how many ids the batch had before de-duplication (for the counters).

        Returns:
            (U,) int64 slot of each id.
        """
        with self._mutex:
            slots, fill = self._place(ids, ids.size if requested is None else requested)
        if fill is not None:
            self._fill(fill)
        return slots

    @contextlib.contextmanager
    def updating(self) -> Iterator[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """Hold the cache to update locked rows: yields (weight, state) and a lookup cannot
        move them (the overflow area grows by reallocation) meanwhile. Mark the rows with
        :meth:`mark_dirty_locked` inside."""
        with self._mutex:
            yield self.weight, self.state

    def mark_dirty_locked(self, slots: np.ndarray) -> None:
        """:meth:`mark_dirty` inside :meth:`updating`."""
        self.dirty[slots] = True

    def _place(self, ids: np.ndarray, requested: int) -> tuple[np.ndarray, _Fill | None]:
        c = self.counters
        self._clock += 1
        c.calls += 1
        c.requested_ids += int(requested)
        c.unique_ids += int(ids.size)
        slots = np.full(ids.size, -1, dtype=np.int64)
        if not ids.size:
            return slots, None
        w = self.ways
        sets = ids % self.num_sets
        match = self.slot_row[: self.main_slots].reshape(self.num_sets, w)[sets] == ids[:, None]  # (U, W)
        hit = match.any(axis=1)
        slots[hit] = sets[hit] * w + match[hit].argmax(axis=1)
        if self.overflow:  # few rows: find which misses are there before asking the dict
            candidates = np.nonzero(~hit)[0]
            held = np.fromiter(self.overflow, dtype=np.int64, count=len(self.overflow))
            for i in candidates[np.isin(ids[candidates], held)].tolist():
                slots[i] = self.overflow[int(ids[i])]
        found = slots >= 0
        self.locks[slots[found]] += 1
        main_hits = slots[hit]
        self.last_used[main_hits] = self._clock

        miss = np.nonzero(~found)[0]  # ascending ids
        c.unique_misses += int(miss.size)
        if not miss.size:
            return slots, None
        miss_sets = sets[miss]
        order = np.argsort(miss_sets, kind="stable")  # by set, ascending id within a set
        miss, miss_sets = miss[order], miss_sets[order]
        first = np.flatnonzero(np.diff(miss_sets, prepend=-1))  # miss_sets is sorted
        touched_sets = miss_sets[first]
        counts = np.diff(first, append=miss_sets.size)
        rank = np.arange(miss.size) - np.repeat(first, counts)
        locks = self.locks[: self.main_slots].reshape(self.num_sets, w)[touched_sets]
        used = self.last_used.reshape(self.num_sets, w)[touched_sets]
        key = np.where(locks > 0, np.iinfo(np.int64).max, used)
        way_order = np.argsort(key, axis=1, kind="stable")
        free = (locks == 0).sum(axis=1)
        of_set = np.repeat(np.arange(touched_sets.size), counts)
        placed = rank < free[of_set]
        victims = touched_sets[of_set[placed]] * w + way_order[of_set[placed], rank[placed]]

        old = self.slot_row[victims]
        write_back = (old >= 0) & self.dirty[victims]
        evict, evicted_rows = victims[write_back], old[write_back]
        self.slot_row[victims] = ids[miss[placed]]
        self.last_used[victims] = self._clock
        self.dirty[victims] = False
        self.locks[victims] = 1
        slots[miss[placed]] = victims

        conflicts = miss[~placed]
        if conflicts.size:
            c.conflict_misses += int(conflicts.size)
            extra = self._overflow_slots(conflicts.size)
            for row, slot in zip(ids[conflicts].tolist(), extra.tolist(), strict=True):
                self.overflow[row] = slot
            self.slot_row[extra] = ids[conflicts]
            self.dirty[extra] = False
            self.locks[extra] = 1
            slots[conflicts] = extra

        # The victims' old rows and the misses' new ones move in _fill, outside the mutex.
        return slots, _Fill(self.weight, self.state, evict, evicted_rows, slots[miss], ids[miss])

    def _fill(self, fill: _Fill) -> None:
        """Write back the dirty victims' old rows, then read the misses into their slots."""
        if fill.evict.size:
            index = torch.from_numpy(fill.evict)
            self.store.write(fill.evicted_rows, fill.weight.index_select(0, index).numpy(),
                             {k: t.index_select(0, index).numpy()
                              for k, t in fill.state.items()})
        weight, states, from_disk = self.store.read(fill.miss_ids)
        index = torch.from_numpy(fill.miss_slots)
        fill.weight.index_copy_(0, index, torch.from_numpy(weight))
        for k, tensor in fill.state.items():
            tensor.index_copy_(0, index, torch.from_numpy(states[k]))
        with self._mutex:
            c = self.counters
            c.rows_written_back += int(fill.evict.size)
            c.bytes_written += int(fill.evict.size) * self.store.row_bytes
            c.bytes_read += from_disk * self.store.row_bytes

    def _overflow_slots(self, n: int) -> np.ndarray:
        """``n`` free overflow slots, growing the area when it is short."""
        short = n - len(self._free_overflow)
        if short > 0:
            old = self.capacity
            grow = max(short, old - self.main_slots)  # at least double the area
            self.weight = torch.cat([self.weight, torch.zeros(grow, self.store.dim)])
            self.state = {
                k: torch.cat([t, torch.zeros(grow, *t.shape[1:])]) for k, t in self.state.items()
            }
            self.slot_row = np.concatenate([self.slot_row, np.full(grow, -1, dtype=np.int64)])
            self.dirty = np.concatenate([self.dirty, np.zeros(grow, dtype=bool)])
            self.locks = np.concatenate([self.locks, np.zeros(grow, dtype=np.int32)])
            self._free_overflow += range(old, old + grow)
        taken, self._free_overflow = self._free_overflow[:n], self._free_overflow[n:]
        return np.asarray(taken, dtype=np.int64)

    def _write_back(self, slots: np.ndarray) -> None:
        if not slots.size:
            return
        index = torch.from_numpy(slots)
        self.store.write(
            self.slot_row[slots],
            self.weight.index_select(0, index).numpy(),
            {k: t.index_select(0, index).numpy() for k, t in self.state.items()},
        )
        self.dirty[slots] = False
        self.counters.rows_written_back += int(slots.size)
        self.counters.bytes_written += int(slots.size) * self.store.row_bytes

    # ---- after a batch ------------------------------------------------------------------

    def mark_dirty(self, slots: np.ndarray) -> None:
        """The optimizer updated these slots."""
        with self._mutex:
            self.dirty[slots] = True

    def release(self, slots: np.ndarray) -> None:
        """A batch is done with its slots; overflow slots no batch holds are written back."""
        with self._mutex:
            self.locks[slots] -= 1
            if (self.locks[slots] < 0).any():
                raise CacheError("a slot was released more often than locked",
                                 where="SetAssociativeRowCache.release")
            spare = slots[(slots >= self.main_slots) & (self.locks[slots] == 0)]
            if spare.size:
                self._write_back(spare[self.dirty[spare]])
                for row in self.slot_row[spare].tolist():
                    del self.overflow[row]
                self.slot_row[spare] = -1
                self._free_overflow += spare.tolist()

    def flush(self) -> None:
        """Write every dirty cached row back to the file."""
        with self._mutex:
            self._write_back(np.nonzero(self.dirty)[0])

    def invalidate(self) -> None:
        """Flush, then forget every cached row (the file becomes the only copy)."""
        with self._mutex:
            if (self.locks > 0).any():
                raise CacheError(
                    f"{self.locked_slots()} cached rows are held by batches in flight",
                    where="SetAssociativeRowCache.invalidate",
                    hint="run the batches' backward (or drop them) before saving the table",
                )
            self._write_back(np.nonzero(self.dirty)[0])
            self.slot_row[:] = -1
            self.last_used[:] = -1
            self.overflow.clear()
            self._free_overflow = list(range(self.main_slots, self.capacity))
