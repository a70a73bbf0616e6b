"""Enumerate the ways to shard each table: sharding type x kernel x block shape.

Options are enumerated by type, not by rank: a table-wise option is one shard that the
partitioner will place, so 1,000 tables on 4,096 ranks make a few thousand options, not
millions. Geometry follows TorchRec: row-wise blocks of ``ceil(rows / n)`` rows (the last
may be shorter; ranks past the last row hold nothing), column-wise blocks of equal width
that divides the dim, is a multiple of 4 and is at least the table's minimum column block
(default: 128, or half the dim for dims under 256, so a dim-64 table may split in two).

Example:
    >>> enum = EmbeddingEnumerator(Topology.preset("h100", 8), batch_size=512)
    >>> [o.label for o in enum.enumerate(TableSpec("C1", 1000, 64))]
    ['table_wise/fused/1', 'row_wise/fused/8', ...]
"""

from __future__ import annotations

import math

import numpy as np

from ctrctl.distributed.planner.estimators import EmbeddingPerfEstimator
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import Enumerator, Estimator, ShardingOption, TableSpec
from ctrctl.names import ComputeKernel, ShardingType

#: Kernels that train, fastest first, per device.
_TRAIN_KERNELS = {
    "cuda": (ComputeKernel.FUSED.value, ComputeKernel.FUSED_UVM_CACHING.value,
             ComputeKernel.FUSED_UVM.value),
    "cpu": (ComputeKernel.FUSED.value,),
}


def row_block_sizes(rows: int, n: int) -> np.ndarray:
    """The row counts of :func:`ctrctl.distributed.types.row_blocks` as an int64 array,
    without a Python loop over thousands of blocks.

    Example:
        >>> row_block_sizes(10, 4).tolist()
        [3, 3, 3, 1]
    """
    size = math.ceil(rows / n)
    count = math.ceil(rows / size)
    sizes = np.full(count, size, dtype=np.int64)
    sizes[-1] = rows - size * (count - 1)
    return sizes


def default_min_col_block(dim: int) -> int:
    """TorchRec's 128, relaxed to half the dim for narrow tables."""
    return min(128, max(dim // 2, 4))


def column_block_counts(dim: int, min_col_block: int, max_blocks: int) -> list[int]:
    """Numbers of equal column blocks to try: powers of two, plus TorchRec's own width (the
    smallest multiple of 4 that is >= 128 and divides the dim)."""
    counts = set()
    k = 2
    while k <= max_blocks and dim // k >= min_col_block:
        if dim % k == 0 and (dim // k) % 4 == 0:
            counts.add(k)
        k *= 2
    for width in range(max(128, min_col_block), dim, 4):
        if dim % width == 0:
            if 1 < dim // width <= max_blocks:
                counts.add(dim // width)
            break
    return sorted(counts)


class EmbeddingEnumerator(Enumerator):
    """Every allowed (sharding type, kernel, block shape) of a table, priced.

    Args:
        topology: the ranks.
        batch_size: samples per rank per step.
        sharding_types: types allowed for every table (None: all); a table's own constraints
            narrow this further.
        estimator: prices the options (default: :class:`EmbeddingPerfEstimator`).
    """

    def __init__(self, topology: Topology, batch_size: int,
                 sharding_types: tuple[str, ...] | None = None,
                 estimator: Estimator | None = None):
        self.topology = topology
        self.batch_size = batch_size
        self.sharding_types = sharding_types
        self.estimator = estimator or EmbeddingPerfEstimator(topology, batch_size)
        self._all_ranks = np.arange(topology.world_size)
        self._all_ranks.setflags(write=False)

    def allowed_types(self, table: TableSpec) -> list[str]:
        types = [t.value for t in ShardingType]
        if self.sharding_types:
            types = [t for t in types if t in self.sharding_types]
        if table.constraints.sharding_types:
            types = [t for t in types if t in table.constraints.sharding_types]
        return types

    def allowed_kernels(self, table: TableSpec, sharding_type: str) -> list[str]:
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            kernels = [ComputeKernel.DENSE.value]
        else:
            kernels = list(_TRAIN_KERNELS[self.topology.device])
        cached = ComputeKernel.FUSED_CACHED.value
        if (self.topology.device == "cpu" and sharding_type != ShardingType.DATA_PARALLEL.value
                and (cached in (table.constraints.compute_kernels or ())
                     or not self._fits_a_rank(table))):
            kernels.append(cached)  # the disk tier: asked for, or the table fits no rank
        if table.constraints.compute_kernels:
            kernels = [k for k in kernels if k in table.constraints.compute_kernels]
        return kernels

    def _fits_a_rank(self, table: TableSpec) -> bool:
        """Whether the whole table with its optimizer state fits one rank's host memory."""
        rows, dim = table.num_embeddings, table.embedding_dim
        total = table.weight_bytes + table.state_bytes(rows, dim)
        return total <= self.topology.ddr_available

    def enumerate(self, table: TableSpec) -> list[ShardingOption]:
        topo = self.topology
        rows_n, dim = table.num_embeddings, table.embedding_dim
        world, local = topo.world_size, topo.local_world_size
        types = self.allowed_types(table)
        forced_single = len(types) == 1
        pinned = set(table.constraints.ranks) if table.constraints.ranks else None
        min_block = table.constraints.min_col_block or default_min_col_block(dim)
        geometries: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                               np.ndarray | None, bool]] = []
        one = np.ones(1, dtype=np.int64)
        zero = np.zeros(1, dtype=np.int64)
        for kind in types:
            if kind == ShardingType.TABLE_WISE.value:
                geometries.append((kind, one * rows_n, one * dim, zero, zero, None, False))
            elif kind == ShardingType.DATA_PARALLEL.value:
                if world == 1 and not forced_single:
                    continue  # one replica is table_wise
                if pinned is not None and len(pinned) < world:
                    continue
                # Replicas are alike: price one, copy it to every rank if it is kept.
                geometries.append((kind, one * rows_n, one * dim, zero, zero, zero, False))
            elif kind in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value):
                span = world if kind == ShardingType.ROW_WISE.value else local
                if span == 1 and not forced_single:
                    continue
                if kind == ShardingType.TABLE_ROW_WISE.value and local == world \
                        and not forced_single:
                    continue  # one host: the same shards as row_wise
                sizes = row_block_sizes(rows_n, span)
                if kind == ShardingType.ROW_WISE.value and pinned is not None \
                        and not set(range(len(sizes))) <= pinned:
                    continue
                offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
                cols = np.full_like(sizes, dim)
                geometries.append((kind, sizes, cols, offsets, np.zeros_like(sizes),
                                   self._all_ranks[:len(sizes)],
                                   kind == ShardingType.TABLE_ROW_WISE.value))
            else:  # column_wise, table_column_wise
                span = world if kind == ShardingType.COLUMN_WISE.value else local
                counts = column_block_counts(dim, min_block, max(span, 1))
                if not counts and forced_single:
                    counts = [1]
                for k in counts:
                    width = dim // k
                    n = np.ones(k, dtype=np.int64)
                    geometries.append((kind, n * rows_n, n * width, 0 * n,
                                       np.arange(k, dtype=np.int64) * width, None,
                                       kind == ShardingType.TABLE_COLUMN_WISE.value))
        options: list[ShardingOption] = []
        for kind, rows, cols, roff, coff, fixed, host_local in geometries:
            same_shape = []
            for kernel in self.allowed_kernels(table, kind):
                clf = None
                if kernel in (ComputeKernel.FUSED_UVM_CACHING.value,
                              ComputeKernel.FUSED_CACHED.value):
                    clf = table.constraints.cache_load_factor or topo.cache_load_factor
                same_shape.append(ShardingOption(
                    table=table, sharding_type=kind, compute_kernel=kernel, rows=rows,
                    cols=cols, row_offsets=roff, col_offsets=coff, fixed_ranks=fixed,
                    host_local=host_local, cache_load_factor=clf))
            options.extend(self.estimator.estimate(same_shape))
        return self._replicate_data_parallel(options, forced_single)

    def _replicate_data_parallel(self, options: list[ShardingOption], forced: bool
                                 ) -> list[ShardingOption]:
        """Drop replicas that cost a rank as much as the whole table does table-wise (they
        raise every rank by more than table-wise raises one); copy the rest to every rank."""
        dp = ShardingType.DATA_PARALLEL.value
        table_wise = [o.total_cost for o in options
                      if o.sharding_type == ShardingType.TABLE_WISE.value and o.pending is None]
        kept = []
        world = self.topology.world_size
        for o in options:
            if o.sharding_type != dp:
                kept.append(o)
                continue
            if table_wise and not forced and o.total_cost >= min(table_wise):
                continue
            # Read-only broadcast views: W identical replicas cost no memory to describe.
            for name in ("rows", "cols", "row_offsets", "col_offsets", "fwd_compute",
                         "bwd_compute", "fwd_comms", "bwd_comms", "hbm", "ddr"):
                setattr(o, name, np.broadcast_to(getattr(o, name)[:1], (world,)))
            o.fixed_ranks = self._all_ranks
            o.set_totals(np.broadcast_to(o.cost[:1], (world,)), o.total_cost * world,
                         o.storage_bytes * world)
            kept.append(o)
        return kept
