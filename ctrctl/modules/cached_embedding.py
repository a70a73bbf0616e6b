"""Embedding bags whose tables live on disk, with a DRAM cache of hot rows (CPU).

The ``fused_cached`` kernel: each table (weights and the fused optimizer's per-row state) is a
memory-mapped file (its blocks reserved at creation), and a
:class:`~ctrctl.modules.row_cache.SetAssociativeRowCache` of ``cache_load_factor x rows``
slots holds the rows a batch reads and the optimizer updates.
The lookup pools over cache slots instead of row ids::

    batch ids ──prefetch──▶ unique ─▶ cache lookup (evict unlocked LRU, write back dirty,
                                       read misses) ─▶ slot per id, slots locked
    forward   embedding_bag(slot per id, cache.weight)
    backward  sum grads per slot, fused update of cache rows, mark dirty, unlock

``prefetch(indices, offsets)`` queues batch i+1's lookup on a worker thread while batch i
computes; its forward then takes the slots ready-made (no misses in the forward). A forward
without a queued prefetch does the lookup inline (slower, same result). Backward does not
wait for a prefetch in flight: the prefetch only evicts and fills slots no batch holds, and
the update of this batch's (locked) slots takes the cache's mutex only against the short
phase of a lookup that picks slots (and may reallocate the overflow area).

The numerics are the plain-torch kernel's (:mod:`ctrctl.modules.torch_embedding`): the same
pooling, the same summation of repeated ids in the same order and
:func:`~ctrctl.modules.optimizers.apply_sparse_update`, so a cached table trains to the same
bits as a resident one that starts from :func:`hashed_init_weight`.

Rules: one batch is in flight per forward (a forward whose backward never ran is released at
the next forward; a forward without grad releases at once). Reading the weights
(:meth:`CachedEmbeddingBag.split_weights`, hence ``state_dict``) flushes, writes the initial
values of untouched rows, empties the cache and returns views of the files: a checkpoint of
a cached table is as large as the table.

Example:
    >>> bag = CachedEmbeddingBag([(10_000_000, 64)], cache_load_factor=0.05,
    ...                          optimizer=EmbeddingOptimizerConfig(lr=0.05))
    >>> bag.prefetch(next_indices, next_offsets)      # overlaps this batch
    >>> bag(indices, offsets).sum().backward()
    >>> bag.counters()[0]["unique_misses"]
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
import weakref
import zlib
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrctl.errors import ConfigError, OutputLocationError, SparseInputError
from ctrctl.modules.embedding_kernel import (
    batch_of,
    copy_optimizer_states,
    copy_weights,
    table_layout,
)
from ctrctl.modules.optimizers import (
    CPU_OPTIMIZERS,
    EmbeddingOptimizerConfig,
    apply_sparse_update,
    state_shapes,
    unsupported_optimizer_error,
)
from ctrctl.modules.row_cache import WAYS, RowFile, SetAssociativeRowCache, hashed_uniform
from ctrctl.modules.torch_embedding import pool_bags, row_gradients
from ctrctl.sparse.ops import complete_cumsum, segment_ranges

#: Prefetched batches kept queued for a forward at most (the oldest unused ones go first).
MAX_QUEUED = 4

__all__ = ["CachedEmbeddingBag", "CachedTableSpec", "hashed_init_weight", "table_seed"]


@dataclasses.dataclass(frozen=True)
class CachedTableSpec:
    """How one cached table is kept: what a shard of it needs to start as the table would.

    Attributes:
        load_factor: share of the rows kept in DRAM.
        seed: the (seed, row id) initialisation's seed (:func:`table_seed`).
        init_range: the uniform init range of the whole table.
        cache_dir: where its files go (None: the system's temporary folder).
    """

    load_factor: float
    seed: int
    init_range: tuple[float, float]
    cache_dir: str | None = None


def table_seed(seed: int, name: str) -> int:
    """The seed of table ``name`` in a collection seeded with ``seed``."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) & 0x7FFFFFFFFFFFFFFF


def hashed_init_weight(rows: int, dim: int, seed: int, init_range: tuple[float, float],
                       chunk: int = 1 << 16) -> torch.Tensor:
    """A whole (rows, dim) table initialised by the (seed, row id) rule of cached tables."""
    out = torch.empty(rows, dim)
    for start in range(0, rows, chunk):
        ids = np.arange(start, min(start + chunk, rows))
        out[start : start + ids.size] = torch.from_numpy(hashed_uniform(seed, ids, dim, *init_range))
    return out


@dataclasses.dataclass
class _TableLookup:
    """One table's part of a batch: the slot of each id, and the distinct slots it locked."""

    slot_per_id: torch.Tensor
    locked: np.ndarray
    forward_misses: int = 0
    released: bool = False


@dataclasses.dataclass
class _Batch:
    indices: torch.Tensor
    offsets: torch.Tensor
    lookups: Future[list[_TableLookup]] | list[_TableLookup]

    def result(self) -> tuple[list[_TableLookup], float]:
        """The lookups, and the seconds spent waiting for them."""
        waited = 0.0
        if isinstance(self.lookups, Future):
            start = time.perf_counter()
            self.lookups = self.lookups.result()
            waited = time.perf_counter() - start
        return self.lookups, waited


class _CachedLookup(torch.autograd.Function):
    """embedding_bag over cache slots; backward updates the slots in place, then unlocks them."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        trigger: torch.Tensor,
        kernel: CachedEmbeddingBag,
        table: int,
        lookup: _TableLookup,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        cache = kernel.caches[table]
        slots = lookup.slot_per_id
        pooled, lengths = pool_bags(slots, cache.weight, offsets, kernel.pooling,
                                    per_sample_weights)  # (bags, D)
        ctx.kernel, ctx.table, ctx.lookup = kernel, table, lookup
        ctx.save_for_backward(slots, lengths, per_sample_weights)
        return pooled

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # (bags, D)
        slots, lengths, per_sample_weights = ctx.saved_tensors
        kernel: CachedEmbeddingBag = ctx.kernel
        cache = kernel.caches[ctx.table]
        # A prefetch in flight may be filling other slots meanwhile: this batch's slots are
        # locked, so it never touches them, and reading them from an older tensor (before
        # the overflow area grew) gives the same values. Slots are distinct per row id, so
        # summing per slot sums repeated ids, in id order.
        rows, summed, grad_weights = row_gradients(
            grad_out, slots, lengths, cache.weight, kernel.pooling,
            per_sample_weights, ctx.needs_input_grad[5],
        )
        with cache.updating() as (weight, state):  # the current tensors, held in place
            apply_sparse_update(kernel.optimizer, kernel.learning_rate, weight, state, rows,
                                summed)
            cache.mark_dirty_locked(rows.numpy())
        kernel._release(ctx.table, ctx.lookup)
        return None, None, None, None, None, grad_weights


class CachedEmbeddingBag(nn.Module):
    """Table-batched embedding bags on disk-backed tables with DRAM row caches (CPU only).

    The interface of :class:`~ctrctl.modules.batched_embedding.BatchedEmbeddingBag`
    (``forward``, ``split_weights``, ``load_weights``, ``optimizer_state``, ...), plus
    :meth:`prefetch`, :meth:`flush` and :meth:`counters`.

    Args:
        tables: (rows, dim) per table.
        feature_table_map: the table each feature looks up (default: feature i -> table i).
        optimizer: the fused optimizer (exact_rowwise_adagrad, exact_adagrad or exact_sgd).
        pooling: "sum" or "mean".
        cache_load_factor: share of each table's rows kept in DRAM (one value or one per table).
        seeds: per table, the seed of its (seed, row id) initialisation (default 0, 1, ...).
        init_ranges: per table, the uniform init range (default +-sqrt(1 / rows)).
        cache_dir: where the table files go (a fresh folder inside it; default the system's
            temporary folder); the files are deleted by :meth:`close`.
        names: table names (file names).
        ways: slots per cache set.
        blocks: per table, (row offset, column offset, full dim) when it is one block of a
            larger table (a shard): its rows initialise as the whole table's would.
    """

    backend = "cached"

    def __init__(
        self,
        tables: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int] | None = None,
        optimizer: EmbeddingOptimizerConfig | None = None,
        pooling: str = "sum",
        cache_load_factor: float | Sequence[float] = 0.2,
        seeds: Sequence[int] | None = None,
        init_ranges: Sequence[tuple[float, float]] | None = None,
        cache_dir: str | Path | None = None,
        names: Sequence[str] | None = None,
        ways: int = WAYS,
        blocks: Sequence[tuple[int, int, int]] | None = None,
    ) -> None:
        super().__init__()
        self.optimizer = optimizer or EmbeddingOptimizerConfig()
        if self.optimizer.kind not in CPU_OPTIMIZERS:
            raise unsupported_optimizer_error(self.optimizer.kind, torch.device("cpu"), "cached")
        if pooling not in ("sum", "mean"):
            raise ConfigError(f"unknown pooling {pooling!r}", where="CachedEmbeddingBag")
        self.tables, self.feature_table_map = table_layout(
            tables, feature_table_map, "CachedEmbeddingBag"
        )
        n = len(self.tables)
        self.pooling = pooling
        self.device = torch.device("cpu")
        self.feature_dims = [self.tables[t][1] for t in self.feature_table_map]
        self.learning_rate = self.optimizer.lr
        factors = ([float(cache_load_factor)] * n if isinstance(cache_load_factor, (int, float))
                   else [float(f) for f in cache_load_factor])
        seeds = list(seeds) if seeds is not None else list(range(n))
        ranges = (list(init_ranges) if init_ranges is not None
                  else [(-(1.0 / r) ** 0.5, (1.0 / r) ** 0.5) for r, _ in self.tables])
        names = list(names) if names is not None else [f"table_{t}" for t in range(n)]
        if not len(factors) == len(seeds) == len(ranges) == len(names) == n:
            raise ConfigError(
                f"{n} tables but {len(factors)} load factors, {len(seeds)} seeds, "
                f"{len(ranges)} init ranges and {len(names)} names",
                where="CachedEmbeddingBag",
            )
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if cache_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ctrctl-cache-")
            directory = Path(self._tmp.name)
        else:
            try:
                Path(cache_dir).mkdir(parents=True, exist_ok=True)
                directory = Path(tempfile.mkdtemp(prefix="tables-", dir=cache_dir))
            except OSError as exc:  # read-only, full, a file in the way
                raise OutputLocationError(
                    f"cannot create the cached tables' folder: {exc.strerror}",
                    where=str(cache_dir), hint="point model.cache_dir at a writable folder "
                                               "with room for the cached tables") from None
            weakref.finalize(self, shutil.rmtree, directory, True)  # scratch, like the above
        self.directory = directory
        self.names = names
        self.caches: list[SetAssociativeRowCache] = []
        try:
            for t, (rows, dim) in enumerate(self.tables):
                store = RowFile(directory, names[t], rows, dim,
                                state_shapes(self.optimizer.kind, dim), seeds[t], ranges[t],
                                blocks[t] if blocks is not None else None)
                self.caches.append(SetAssociativeRowCache(store, factors[t], ways))
        except BaseException:  # a full disk: remove what was created before saying so
            for cache in self.caches:
                cache.store.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._table_features = [
            [f for f, t in enumerate(self.feature_table_map) if t == table] for table in range(n)
        ]
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctrctl-prefetch")
        self._queued: deque[_Batch] = deque()
        self._in_flight: list[tuple[int, _TableLookup]] = []
        self.forward_misses = [0] * n
        #: Seconds spent in cache lookups (prefetches on the worker and inline ones).
        self.lookup_seconds = 0.0
        #: Per table, seconds of its lookups on the worker (prefetches) and inline (forwards).
        self.prefetch_lookup_seconds = [0.0] * n
        self.inline_lookup_seconds = [0.0] * n
        #: Seconds the caller's thread waited for prefetches (in forward, backward, flush).
        self.prefetch_wait_seconds = 0.0
        self._trigger = torch.zeros(0, requires_grad=True)

    # ---- batches ------------------------------------------------------------------------

    def _check(self, indices: torch.Tensor, offsets: torch.Tensor) -> int:
        if indices.device.type != "cpu":
            raise ConfigError("the cached kernel runs on CPU", where="CachedEmbeddingBag",
                              hint="keep the sparse features on the CPU")
        return batch_of(offsets, len(self.feature_table_map), "CachedEmbeddingBag")

    def _positions(self, offsets: torch.Tensor, batch: int, table: int) -> torch.Tensor:
        chosen = torch.tensor(self._table_features[table])
        feature_offsets = offsets[::batch]
        return segment_ranges(feature_offsets, chosen, chosen + 1)

    def _lookup_all(self, indices: torch.Tensor, offsets: torch.Tensor, prefetched: bool
                    ) -> list[_TableLookup]:
        start = time.perf_counter()
        try:
            seconds = self.prefetch_lookup_seconds if prefetched else self.inline_lookup_seconds
            return self._lookup_tables(indices, offsets, seconds)
        finally:
            self.lookup_seconds += time.perf_counter() - start

    def _lookup_tables(self, indices: torch.Tensor, offsets: torch.Tensor,
                       seconds: list[float]) -> list[_TableLookup]:
        batch = self._check(indices, offsets)
        out = []
        for t, (rows, _) in enumerate(self.tables):
            if batch == 0 or not self._table_features[t]:
                out.append(_TableLookup(torch.zeros(0, dtype=torch.long), np.zeros(0, np.int64)))
                continue
            start = time.perf_counter()
            ids = indices[self._positions(offsets, batch, t)]
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
                raise SparseInputError(
                    f"table {t}: ids must lie in [0, {rows}), got {int(ids.min())}.."
                    f"{int(ids.max())}",
                    where="CachedEmbeddingBag",
                )
            unique, inverse = torch.unique(ids, return_inverse=True)
            before = self.caches[t].counters.unique_misses
            slots = self.caches[t].lookup_and_lock(unique.numpy(), requested=ids.numel())
            lookup = _TableLookup(torch.from_numpy(slots)[inverse], slots)
            lookup.forward_misses = self.caches[t].counters.unique_misses - before
            out.append(lookup)
            seconds[t] += time.perf_counter() - start
        return out

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """Bring a coming batch's rows into the caches on the worker thread (returns at once).

        The batch's rows stay locked until its backward; its forward uses the slots found
        here. Call it for batch i+1 while batch i computes, with the same tensors forward
        will get.
        """
        indices, offsets = indices.long(), offsets.long()
        future = self._executor.submit(self._lookup_all, indices, offsets, True)
        self._queued.append(_Batch(indices, offsets, future))

    def wait_prefetch(self) -> None:
        """Wait for every queued prefetch to finish."""
        for batch in self._queued:
            self._result(batch)

    def _result(self, batch: _Batch) -> list[_TableLookup]:
        lookups, waited = batch.result()
        self.prefetch_wait_seconds += waited
        return lookups

    def _take(self, indices: torch.Tensor, offsets: torch.Tensor) -> list[_TableLookup]:
        # The prefetch for this batch, if queued. Others stay queued: a batch that is not
        # the next to train (validation between two training steps) leaves the next
        # training batch's prefetch in place. The oldest beyond MAX_QUEUED are dropped.
        for k, batch in enumerate(self._queued):
            if torch.equal(batch.indices, indices) and torch.equal(batch.offsets, offsets):
                del self._queued[k]
                return self._result(batch)
        while len(self._queued) >= MAX_QUEUED:
            self.drop_prefetch(1)
        lookups = self._lookup_all(indices, offsets, False)
        for t, lookup in enumerate(lookups):
            self.forward_misses[t] += lookup.forward_misses
        return lookups

    def drop_prefetch(self, count: int | None = None) -> None:
        """Release the oldest ``count`` queued prefetches (all: None), unused."""
        n = len(self._queued) if count is None else min(count, len(self._queued))
        for _ in range(n):
            for t, lookup in enumerate(self._result(self._queued.popleft())):
                self._release(t, lookup)

    def _release(self, table: int, lookup: _TableLookup) -> None:
        if not lookup.released:
            lookup.released = True
            self.caches[table].release(lookup.locked)

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pooled embeddings (B, sum of feature dims), features in ``feature_table_map`` order."""
        indices, offsets = indices.long(), offsets.long()
        batch = self._check(indices, offsets)
        for t, lookup in self._in_flight:  # forwards whose backward never ran
            self._release(t, lookup)
        self._in_flight = []
        if batch == 0:
            return torch.zeros(0, sum(self.feature_dims))
        lookups = self._take(indices, offsets)
        lengths = (offsets[1:] - offsets[:-1]).view(len(self.feature_table_map), batch)
        grad = torch.is_grad_enabled()
        trigger = self._trigger if grad else self._trigger.detach()
        blocks: list[torch.Tensor | None] = [None] * len(self.feature_table_map)
        for t, features in enumerate(self._table_features):
            if not features:
                continue
            table_offsets = complete_cumsum(lengths[torch.tensor(features)].reshape(-1))
            weights = None
            if per_sample_weights is not None:
                weights = per_sample_weights[self._positions(offsets, batch, t)]
            pooled = _CachedLookup.apply(trigger, self, t, lookups[t], table_offsets, weights)
            per_feature = pooled.view(len(features), batch, self.tables[t][1])
            for i, f in enumerate(features):
                blocks[f] = per_feature[i]
            if grad:
                self._in_flight.append((t, lookups[t]))
            else:
                self._release(t, lookups[t])
        return torch.cat(blocks, dim=1)  # type: ignore[arg-type]

    # ---- state --------------------------------------------------------------------------

    def set_learning_rate(self, lr: float) -> None:
        self.learning_rate = float(lr)

    def counters(self) -> list[dict[str, int]]:
        """Per table, its cache counters, plus ``forward_misses`` (misses of inline lookups)."""
        return [
            {**cache.counters.as_dict(), "forward_misses": self.forward_misses[t]}
            for t, cache in enumerate(self.caches)
        ]

    def stats(self) -> list[dict[str, float]]:
        """Per table, :meth:`counters` plus ``dram_bytes`` and its lookup seconds.

        ``prefetch_seconds``: its lookups on the worker thread; ``inline_lookup_seconds``:
        those a forward did itself. The thread's waits for prefetches are per kernel
        (:attr:`prefetch_wait_seconds`), not per table.
        """
        return [
            {**{k: float(v) for k, v in counters.items()},
             "dram_bytes": float(self.caches[t].dram_bytes()),
             "prefetch_seconds": self.prefetch_lookup_seconds[t],
             "inline_lookup_seconds": self.inline_lookup_seconds[t]}
            for t, counters in enumerate(self.counters())
        ]

    def dram_bytes(self) -> int:
        """Memory the caches hold (slots, metadata and touched maps)."""
        return sum(cache.dram_bytes() for cache in self.caches)

    def locked_rows(self) -> int:
        """Cached rows some batch in flight still holds."""
        return sum(cache.locked_slots() for cache in self.caches)

    def flush(self) -> None:
        """Write every dirty cached row to the files (after queued prefetches finish)."""
        self.wait_prefetch()
        for cache in self.caches:
            cache.flush()

    def _settle(self) -> None:
        """No batch in flight, the caches empty, the files complete: ready to be read."""
        self.wait_prefetch()
        while self._queued:
            for t, lookup in enumerate(self._result(self._queued.popleft())):
                self._release(t, lookup)
        for t, lookup in self._in_flight:
            self._release(t, lookup)
        self._in_flight = []
        for cache in self.caches:
            cache.invalidate()
            cache.store.materialize()

    def split_weights(self) -> list[torch.Tensor]:
        """One (rows, dim) tensor per table: views of the files (writes go through).

        Flushes and empties the caches and writes untouched rows' initial values first.
        """
        self._settle()
        return [torch.from_numpy(cache.store.weight) for cache in self.caches]

    def load_weights(self, weights: Sequence[torch.Tensor]) -> None:
        """Copy one (rows, dim) tensor per table into the files."""
        copy_weights(self.split_weights(), weights, "CachedEmbeddingBag")

    def optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        """Per table, the optimizer state as views of the files (as ``BatchedEmbeddingBag``)."""
        self._settle()
        return [{k: torch.from_numpy(a) for k, a in cache.store.states.items()}
                for cache in self.caches]

    def load_optimizer_state(self, states: Sequence[dict[str, torch.Tensor]]) -> None:
        """Copy per-table optimizer state into the files."""
        copy_optimizer_states(self.optimizer_state(), states, "CachedEmbeddingBag")

    def close(self) -> None:
        """Stop the worker and delete the table files."""
        self._executor.shutdown(wait=True)
        for cache in self.caches:
            cache.store.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def extra_repr(self) -> str:
        factors = [round(c.main_slots / max(r, 1), 4) for c, (r, _) in zip(
            self.caches, self.tables, strict=True)]
        return (f"backend=cached, tables={self.tables}, slots/rows={factors}, "
                f"pooling={self.pooling}, optimizer={self.optimizer.kind}")
