"""Table-row-wise sharding: a table's row blocks on the ranks of one host.

Input: as row-wise (:mod:`ctrctl.distributed.sharding.rw`), ids bucketized by row block and
sent to the block's rank, which is always on the table's host. Lookup: partial sums over the
global batch. Output: the pooled all-to-all returns each source rank the partials of every
block, summed there. That moves the bytes of a host-local reduce-scatter followed by the
cross-host all-to-all in one collective, and works whatever ranks of the host the blocks use.

Example:
    >>> TwrwSharding(tables, shardings, FusedOptimizerSpec())(lengths, values, None)
"""

from __future__ import annotations

from ctrctl.distributed.sharding.rw import RwSharding
from ctrctl.distributed.types import ShardingType


class TwrwSharding(RwSharding):
    """Row blocks within one host, partials summed at the source (see the module docstring)."""

    sharding_type = ShardingType.TABLE_ROW_WISE.value
    reduce_scatter = False
