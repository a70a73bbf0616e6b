"""Options as arrays: every table's sharding options priced in a few numpy passes.

At thousands of tables the per-table :class:`~ctrctl.distributed.planner.types.ShardingOption`
objects cost milliseconds each to build and price. Here an option *kind* (a sharding type, a
block count and a kernel) is one column, and every table one row: ``(T, K)`` arrays hold
each option's shard count and the cost and memory of its first and last shard (row-wise
blocks are alike but the last; the other types' shards are all alike). The prices come from
the same cost model (:func:`~ctrctl.distributed.planner.estimators.shard_terms` and
:func:`~ctrctl.distributed.planner.estimators.kernel_parts`), applied to all tables at once,
and the enumeration rules are the enumerator's (:class:`EmbeddingEnumerator`), so an option
here is the option there; :meth:`OptionArrays.option` builds that object for the chosen ones.

Example:
    >>> arrays = OptionArrays.build(tables, topology, batch_size=512)
    >>> arrays.valid.shape            # (tables, kinds)
    >>> arrays.option(0, int(np.argmin(np.where(arrays.valid[0], arrays.total, np.inf))))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctrctl.distributed.planner.enumerators import (
    _TRAIN_KERNELS,
    column_block_counts,
    default_min_col_block,
)
from ctrctl.distributed.planner.estimators import (
    TableColumns,
    kernel_parts,
    price,
    shard_terms,
)
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import OPTIMIZER_STATE, ShardingOption, TableSpec
from ctrctl.names import ComputeKernel, ShardingType

_TW, _DP = ShardingType.TABLE_WISE.value, ShardingType.DATA_PARALLEL.value
_RW, _TWRW = ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value
_CW, _TWCW = ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value
#: The parts of a price kept per shard, in :class:`ShardingOption`'s order.
PARTS = ("fwd_compute", "bwd_compute", "fwd_comms", "bwd_comms", "hbm", "ddr")


@dataclass(frozen=True)
class Kind:
    """One column of :class:`OptionArrays`: a sharding type, its block count (column types;
    0 otherwise) and a kernel. ``rank`` orders a type's kernels (0: the fastest)."""

    sharding_type: str
    blocks: int
    kernel: str
    rank: int

    @property
    def shape(self) -> tuple[str, int]:
        return (self.sharding_type, self.blocks)


def supports(tables: list[TableSpec], sharding_types: tuple[str, ...] | None) -> bool:
    """Whether the array path enumerates exactly what the enumerator would: tables without
    per-table constraints, and more than one sharding type to choose from."""
    if any(t.constraints != type(t.constraints)() for t in tables):
        return False
    return sharding_types is None or len(sharding_types) > 1


class OptionArrays:
    """Every table's options as ``(T, K)`` arrays (see the module docstring).

    Attributes:
        tables, kinds: the rows and the columns.
        valid: ``(T, K)`` whether the table has that option.
        shards: ``(T, K)`` number of shards.
        first, last: part name -> ``(T, K)`` value of the first and the last shard.
        cost1, cost_last: seconds per step of the first and last shard.
        total: seconds per step of all shards; storage: bytes of all shards.
        rows1, rows_last, cols: the first and last shard's rows, every shard's columns.
    """

    def __init__(self, tables: list[TableSpec], kinds: list[Kind]):
        self.tables = tables
        self.kinds = kinds
        shape = (len(tables), len(kinds))
        self.valid = np.zeros(shape, dtype=bool)
        self.shards = np.ones(shape, dtype=np.int64)
        self.rows1 = np.zeros(shape, dtype=np.int64)
        self.rows_last = np.zeros(shape, dtype=np.int64)
        self.cols = np.zeros(shape, dtype=np.int64)
        self.first = {p: np.zeros(shape) for p in PARTS}
        self.last = {p: np.zeros(shape) for p in PARTS}
        self.clf: float | None = None
        self.topology: Topology | None = None
        self.batch_size = 0

    # ---- derived -------------------------------------------------------------------
    @property
    def cost1(self) -> np.ndarray:
        return sum(self.first[p] for p in PARTS[:4])  # type: ignore[return-value]

    @property
    def cost_last(self) -> np.ndarray:
        return sum(self.last[p] for p in PARTS[:4])  # type: ignore[return-value]

    def finish(self) -> None:
        """Cache the totals once every column is priced."""
        k = self.shards
        self.c1, self.cl = self.cost1, self.cost_last
        self.total = np.where(self.valid, self.c1 * (k - 1) + self.cl, np.inf)
        self.hbm1, self.ddr1 = self.first["hbm"], self.first["ddr"]
        self.hbm_total = self.hbm1 * (k - 1) + self.last["hbm"]
        self.ddr_total = self.ddr1 * (k - 1) + self.last["ddr"]
        self.storage = np.where(self.valid, self.hbm_total + self.ddr_total, np.inf)

    # ---- building ------------------------------------------------------------------
    @classmethod
    def build(cls, tables: list[TableSpec], topology: Topology, batch_size: int,
              sharding_types: tuple[str, ...] | None = None) -> OptionArrays:
        """Enumerate and price every option of every table (as the enumerator does)."""
        world, local = topology.world_size, topology.local_world_size
        types = [t.value for t in ShardingType
                 if not sharding_types or t.value in sharding_types]
        kernels = list(_TRAIN_KERNELS[topology.device])
        n = len(tables)
        rows = np.array([t.num_embeddings for t in tables], dtype=np.int64)
        dims = np.array([t.embedding_dim for t in tables], dtype=np.int64)
        columns = TableColumns(
            np.array([t.element_bytes for t in tables]),
            np.array([t.pooling_factor for t in tables]), rows.astype(np.float64),
            np.array([OPTIMIZER_STATE[t.optimizer][0] for t in tables]),
            np.array([OPTIMIZER_STATE[t.optimizer][1] for t in tables]),
            np.array([t.remap_bytes_per_row for t in tables]),
            np.array([t.remap_ns_per_id for t in tables]))
        state = (columns.state_per_row * 4.0 * rows  # type: ignore[operator]
                 + columns.state_per_element * 4.0 * rows * dims)  # type: ignore[operator]
        whole = np.array([t.weight_bytes for t in tables]) + state
        too_big = whole > topology.ddr_available  # CPU: the disk tier for these
        # Per (dim, min block), the column counts the enumerator would try.
        counts_by_type: dict[str, dict[int, list[int]]] = {}
        for kind in (_CW, _TWCW):
            span = world if kind == _CW else local
            counts_by_type[kind] = {int(d): column_block_counts(
                int(d), default_min_col_block(int(d)), max(span, 1)) for d in set(dims.tolist())}
        kinds: list[Kind] = []
        geometry: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for kind in types:
            valid = np.ones(n, dtype=bool)
            if kind == _TW:
                shapes = [(0, rows, rows, np.ones(n, dtype=np.int64), dims, valid)]
            elif kind == _DP:
                if world == 1:
                    continue
                shapes = [(0, rows, rows, np.full(n, world, dtype=np.int64), dims, valid)]
            elif kind in (_RW, _TWRW):
                span = world if kind == _RW else local
                if span == 1 or (kind == _TWRW and local == world):
                    continue
                block = -(-rows // span)
                count = -(-rows // block)
                shapes = [(0, block, rows - block * (count - 1), count, dims, valid)]
            else:
                all_counts = sorted({c for cs in counts_by_type[kind].values() for c in cs})
                shapes = []
                for c in all_counts:
                    ok = np.array([c in counts_by_type[kind][int(d)] for d in dims])
                    width = np.where(ok, dims // c, dims)
                    shapes.append((c, rows, rows, np.full(n, c, dtype=np.int64), width, ok))
            for blocks, r1, rl, count, width, ok in shapes:
                allowed = [ComputeKernel.DENSE.value] if kind == _DP else list(kernels)
                if topology.device == "cpu" and kind != _DP and too_big.any():
                    allowed.append(ComputeKernel.FUSED_CACHED.value)
                for rank, kernel in enumerate(allowed):
                    kinds.append(Kind(kind, blocks, kernel, rank))
                    mask = ok & (too_big if kernel == ComputeKernel.FUSED_CACHED.value
                                 else True)
                    geometry.append((mask, r1, rl, count, width))
        arrays = cls(tables, kinds)
        arrays.topology, arrays.batch_size = topology, batch_size
        arrays.clf = topology.cache_load_factor
        terms_cache: dict[tuple[str, int], tuple[object, object]] = {}
        for j, (kind_, (mask, r1, rl, count, width)) in enumerate(zip(kinds, geometry,
                                                                      strict=True)):
            arrays.valid[:, j] = mask
            arrays.shards[:, j] = count
            arrays.rows1[:, j], arrays.rows_last[:, j], arrays.cols[:, j] = r1, rl, width
            key = kind_.shape
            if key not in terms_cache:  # the kernels of one shape share their terms
                terms_cache = {key: tuple(  # type: ignore[dict-item]
                    shard_terms(kind_.sharding_type, r.astype(np.float64),
                                width.astype(np.float64), columns, topology, batch_size)
                    for r in (r1, rl))}
            clf = (None if kind_.kernel not in (ComputeKernel.FUSED_UVM_CACHING.value,
                                                ComputeKernel.FUSED_CACHED.value)
                   else topology.cache_load_factor)
            for side, terms in zip((arrays.first, arrays.last), terms_cache[key], strict=True):
                parts = kernel_parts(kind_.kernel, clf, terms, topology)  # type: ignore[arg-type]
                for name, value in zip(PARTS, parts[:6], strict=True):
                    side[name][:, j] = np.broadcast_to(value, (n,))
        arrays.finish()
        arrays._drop_costly_replicas()
        return arrays

    def _drop_costly_replicas(self) -> None:
        """The enumerator's rule: a replica that costs a rank as much as the whole table
        does table-wise (fastest kernel) is no option."""
        tw = [j for j, k in enumerate(self.kinds) if k.sharding_type == _TW and k.rank == 0]
        for j, kind in enumerate(self.kinds):
            if kind.sharding_type == _DP and tw:
                self.valid[:, j] &= self.c1[:, j] < self.total[:, tw[0]]
        self.finish()

    # ---- one option as an object ---------------------------------------------------
    def option(self, t: int, j: int) -> ShardingOption:
        """Table ``t``'s option ``j`` as the enumerator would have built and priced it."""
        kind = self.kinds[j]
        table = self.tables[t]
        k = int(self.shards[t, j])
        topology = self.topology
        assert topology is not None
        if k == 1:
            rows = np.array([self.rows_last[t, j]], dtype=np.int64)
            cols = np.array([self.cols[t, j]], dtype=np.int64)
        else:
            rows = np.full(k, self.rows1[t, j], dtype=np.int64)
            rows[-1] = self.rows_last[t, j]
            cols = np.full(k, self.cols[t, j], dtype=np.int64)
        fixed = None
        row_offsets = np.zeros(k, dtype=np.int64)
        col_offsets = np.zeros(k, dtype=np.int64)
        if kind.sharding_type in (_RW, _TWRW):
            row_offsets = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
            fixed = np.arange(k, dtype=np.int64)
        elif kind.sharding_type in (_CW, _TWCW):
            col_offsets = np.arange(k, dtype=np.int64) * cols[0]
        elif kind.sharding_type == _DP:
            fixed = np.arange(k, dtype=np.int64)
        clf = (topology.cache_load_factor if kind.kernel in (
            ComputeKernel.FUSED_UVM_CACHING.value, ComputeKernel.FUSED_CACHED.value) else None)
        option = ShardingOption(
            table=table, sharding_type=kind.sharding_type, compute_kernel=kind.kernel,
            rows=rows, cols=cols, row_offsets=row_offsets, col_offsets=col_offsets,
            fixed_ranks=fixed, host_local=kind.sharding_type in (_TWRW, _TWCW),
            cache_load_factor=clf)
        for name in PARTS:
            if k == 1:
                setattr(option, name, np.array([self.last[name][t, j]]))
                continue
            values = np.full(k, self.first[name][t, j])
            values[-1] = self.last[name][t, j]
            setattr(option, name, values)
        if kind.kernel == ComputeKernel.FUSED_CACHED.value:  # its disk bytes too
            return price(option, topology, self.batch_size)
        option.pooled_bytes = float(self.batch_size * table.embedding_dim
                                    * table.element_bytes)
        option.finish_pricing()
        return option
