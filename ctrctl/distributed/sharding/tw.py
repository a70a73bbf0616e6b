"""Table-wise sharding: each table lives whole on one rank.

Input: every id of a feature goes to its table's rank. Lookup: that rank pools the table for
the global batch. Output: the pooled all-to-all returns each source rank its rows.

Example:
    >>> TwSharding(tables, shardings, FusedOptimizerSpec())(lengths, values, None)
"""

from __future__ import annotations

from ctrctl.distributed.sharding.routed import RoutedSharding
from ctrctl.errors import PlanError
from ctrctl.names import ShardingType


class TwSharding(RoutedSharding):
    """Tables placed whole, one rank each (see the module docstring)."""

    sharding_type = ShardingType.TABLE_WISE.value

    def check_geometry(self) -> None:
        for table, ps in zip(self.tables, self.shardings, strict=True):
            if len(ps.shards) != 1:
                raise PlanError(f"table_wise needs one shard, the plan has {len(ps.shards)}",
                                where=f"table {table.name!r}")
