"""Table-wise sharding: each table lives whole on one rank.

Input dist: every id of a feature goes, unchanged, to its table's rank (no bucketizing: a
table is one block). Lookup: that rank pools the table for the global batch. Output dist: the
pooled all-to-all returns each source rank its rows, placed in feature order.

Example:
    >>> TwSharding(tables, shardings, EmbeddingOptimizerConfig())(lengths, values, None)
    >>> received = tw.input_dist(lengths, values, None)     # the stages one by one
    >>> out = tw.output_dist(tw.lookup(received), received, lengths)
"""

from __future__ import annotations

import torch

from ctrctl.distributed.sharding.common import RoutedInput, route_whole_features
from ctrctl.distributed.sharding.routed import RoutedSharding
from ctrctl.errors import PlanError
from ctrctl.names import ShardingType


class TwSharding(RoutedSharding):
    """Tables placed whole, one rank each (see the module docstring)."""

    sharding_type = ShardingType.TABLE_WISE.value

    def route_input(self, lengths: torch.Tensor, values: torch.Tensor,
                    weights: torch.Tensor | None) -> RoutedInput:
        """Each feature's bags, whole, to its table's rank (no bucketizing)."""
        return route_whole_features(self.layout, lengths, values, weights)

    def check_geometry(self) -> None:
        for table, ps in zip(self.tables, self.shardings, strict=True):
            if len(ps.shards) != 1:
                raise PlanError(f"table_wise needs one shard, the plan has {len(ps.shards)}",
                                where=f"table {table.name!r}")
