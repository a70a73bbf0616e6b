"""Plans without a planner: table-wise round robin, or one forced sharding type (for tests).

Geometry is TorchRec's: row blocks of ``ceil(rows / n)`` rows (the last one shorter; fewer
blocks when a table has fewer rows than ranks); column blocks of equal width dividing the
dimension, a multiple of 4 (FBGEMM's alignment), at least ``min_block_width`` columns wide.

Example:
    >>> plan = default_plan(tables, world_size=2)                 # table-wise round robin
    >>> plan = forced_plan(tables, 4, "row_wise")                 # every table row-wise
    >>> plan = forced_plan(tables, 2, {"t0": "column_wise", "t1": "data_parallel"})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ctrctl.distributed.types import (
    ComputeKernel,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
    row_blocks,
)
from ctrctl.errors import PlanError
from ctrctl.modules.embedding_configs import EmbeddingBagConfig


def column_blocks(dim: int, max_blocks: int, min_block_width: int = 4) -> list[tuple[int, int]]:
    """(col_offset, cols) of the most equal blocks (up to ``max_blocks``) that tile ``dim``.

    Each block's width divides ``dim``, is a multiple of 4 and at least ``min_block_width``;
    a dimension that cannot be cut stays one block.
    """
    for n in range(max(1, max_blocks), 0, -1):
        width = dim // n
        if dim % n == 0 and width % 4 == 0 and width >= min_block_width:
            return [(j * width, width) for j in range(n)]
    return [(0, dim)]


def table_sharding(
    table: EmbeddingBagConfig,
    sharding_type: str,
    world_size: int,
    local_world_size: int | None = None,
    index: int = 0,
    min_block_width: int = 4,
) -> ParameterSharding:
    """One table's :class:`ParameterSharding` of ``sharding_type``.

    Args:
        table: the table.
        sharding_type: a :class:`ShardingType` value.
        world_size: ranks in the world.
        local_world_size: ranks per host (default: all on one host).
        index: the table's position, used to spread placements round robin.
        min_block_width: narrowest column block for column-wise types.
    """
    local = local_world_size or world_size
    rows, dim = table.num_embeddings, table.embedding_dim
    kind = ShardingType(sharding_type)
    kernel = ComputeKernel.FUSED.value
    shards: list[ShardMetadata]
    if kind is ShardingType.DATA_PARALLEL:
        kernel = ComputeKernel.DENSE.value
        shards = [ShardMetadata(r, 0, 0, rows, dim) for r in range(world_size)]
    elif kind is ShardingType.TABLE_WISE:
        shards = [ShardMetadata(index % world_size, 0, 0, rows, dim)]
    elif kind is ShardingType.ROW_WISE:
        shards = [ShardMetadata(r, off, 0, n, dim)
                  for r, (off, n) in enumerate(row_blocks(rows, world_size))]
    elif kind is ShardingType.TABLE_ROW_WISE:
        host = index % (world_size // local)
        shards = [ShardMetadata(host * local + r, off, 0, n, dim)
                  for r, (off, n) in enumerate(row_blocks(rows, local))]
    elif kind is ShardingType.COLUMN_WISE:
        shards = [ShardMetadata((index + j) % world_size, 0, off, rows, n)
                  for j, (off, n) in enumerate(column_blocks(dim, world_size, min_block_width))]
    else:  # TABLE_COLUMN_WISE: the blocks stay on one host; several may share a rank
        host = index % (world_size // local)
        blocks = column_blocks(dim, 2 * local, min_block_width)
        shards = [ShardMetadata(host * local + (index + j) % local, 0, off, rows, n)
                  for j, (off, n) in enumerate(blocks)]
    return ParameterSharding(kind.value, kernel, rows, dim, tuple(shards))


def forced_plan(
    tables: Sequence[EmbeddingBagConfig],
    world_size: int,
    sharding_type: str | Mapping[str, str],
    local_world_size: int | None = None,
    min_block_width: int = 4,
) -> ShardingPlan:
    """A plan with one sharding type for every table, or a type per table name.

    Args:
        tables: the model's tables.
        world_size: ranks.
        sharding_type: a type for all tables, or table name -> type (mixed plans).
        local_world_size: ranks per host.
        min_block_width: narrowest column block.
    """
    local = local_world_size or world_size
    entries = {}
    for i, table in enumerate(tables):
        kind = (sharding_type if isinstance(sharding_type, str)
                else sharding_type.get(table.name))
        if kind is None:
            raise PlanError(f"no sharding type given for table {table.name!r}",
                            where="forced_plan")
        entries[table.name] = table_sharding(table, kind, world_size, local, i,
                                             min_block_width)
    plan = ShardingPlan(world_size, local, entries, metadata={"planner": "forced"})
    plan.validate({t.name: (t.num_embeddings, t.embedding_dim) for t in tables})
    return plan


def default_plan(tables: Sequence[EmbeddingBagConfig], world_size: int,
                 local_world_size: int | None = None) -> ShardingPlan:
    """Table-wise, the largest tables first, each on the least loaded rank (by bytes).

    The plan to use when no planner output is given.
    """
    load = [0] * world_size
    entries = {}
    for table in sorted(tables, key=lambda t: -t.num_embeddings * t.embedding_dim):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        load[rank] += table.num_embeddings * table.embedding_dim * 4
        entries[table.name] = ParameterSharding(
            ShardingType.TABLE_WISE.value, ComputeKernel.FUSED.value, table.num_embeddings,
            table.embedding_dim,
            (ShardMetadata(rank, 0, 0, table.num_embeddings, table.embedding_dim),),
            storage_bytes=table.num_embeddings * table.embedding_dim * 4)
    ordered = {t.name: entries[t.name] for t in tables}
    plan = ShardingPlan(world_size, local_world_size or world_size, ordered,
                        metadata={"planner": "default_table_wise"})
    plan.validate({t.name: (t.num_embeddings, t.embedding_dim) for t in tables})
    return plan
