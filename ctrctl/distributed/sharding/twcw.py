"""Table-column-wise sharding: column blocks placed table-wise (a rank may hold several).

The data flow is column-wise's (:mod:`ctrctl.distributed.sharding.cw`): ids go to every
block's rank, pooled blocks come back through the pooled all-to-all and are placed side by side.
The difference is placement: the planner puts a table's blocks on the ranks of one host, and
several blocks of one table may share a rank, where they are pooled by one kernel call.

Example:
    >>> TwcwSharding(tables, shardings, FusedOptimizerSpec())(lengths, values, None)
"""

from __future__ import annotations

from ctrctl.distributed.sharding.cw import CwSharding
from ctrctl.names import ShardingType


class TwcwSharding(CwSharding):
    """Column blocks placed table-wise (see the module docstring)."""

    sharding_type = ShardingType.TABLE_COLUMN_WISE.value
