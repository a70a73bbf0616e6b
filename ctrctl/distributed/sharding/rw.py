"""Row-wise sharding: a table's rows cut into blocks of ``ceil(rows / world)``, one per rank.

Input: ids are bucketized by row block (FBGEMM's ``block_bucketize_sparse_features``; plain
torch for uneven blocks or without FBGEMM) and made block-local; each bucket goes to its rank.
Lookup: each rank pools its rows for the global batch: partial sums. Output: a reduce-scatter
sums the partials over ranks and leaves each rank its own samples (backward: all-gather).
Mean pooling is taken at the source, dividing the sum by the bag lengths it holds.

Example:
    >>> RwSharding(tables, shardings, FusedOptimizerSpec())(lengths, values, None)
"""

from __future__ import annotations

from ctrctl.distributed.sharding.routed import RoutedSharding
from ctrctl.errors import PlanError
from ctrctl.names import ShardingType


class RwSharding(RoutedSharding):
    """Row blocks on ranks, partial sums reduce-scattered (see the module docstring)."""

    sharding_type = ShardingType.ROW_WISE.value
    reduce_scatter = True

    def check_geometry(self) -> None:
        for table, ps in zip(self.tables, self.shardings, strict=True):
            if any(s.cols != table.embedding_dim for s in ps.shards):
                raise PlanError(f"{self.sharding_type} shards must span all columns",
                                where=f"table {table.name!r}")
