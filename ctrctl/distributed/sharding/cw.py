"""Column-wise sharding: a table's columns cut into blocks, each block on one rank.

Input: every id of a feature goes to each rank holding a column block of its table. Lookup:
each rank pools its column blocks for the global batch. Output: the pooled all-to-all returns
the blocks to the source rank, which places them side by side.

Geometry as TorchRec: blocks whose width divides the dimension (see
:func:`ctrctl.distributed.default_plan.column_blocks`). With ``exact_rowwise_adagrad`` each
block keeps its own per-row accumulator (the mean of squared gradients over its columns), so
updates differ from an unsharded table's; elementwise Adagrad and SGD match exactly.

Example:
    >>> CwSharding(tables, shardings, FusedOptimizerSpec())(lengths, values, None)
"""

from __future__ import annotations

from ctrctl.distributed.sharding.routed import RoutedSharding
from ctrctl.errors import PlanError
from ctrctl.names import ShardingType


class CwSharding(RoutedSharding):
    """Column blocks on ranks, ids sent to every block's rank (see the module docstring)."""

    sharding_type = ShardingType.COLUMN_WISE.value

    def check_geometry(self) -> None:
        for table, ps in zip(self.tables, self.shardings, strict=True):
            if any(s.rows != table.num_embeddings for s in ps.shards):
                raise PlanError(f"{self.sharding_type} shards must span all rows",
                                where=f"table {table.name!r}")
