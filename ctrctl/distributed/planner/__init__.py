"""The sharding planner: choose a sharding type, kernel and ranks for every table.

Pure (no processes, no devices, no tracking): tables + topology + constraints -> cost model
-> search -> :class:`ctrctl.distributed.types.ShardingPlan` (``plan.json``). See
``planner.py`` for the pipeline and ``estimators.py`` for the cost model; measuring this
machine (calibration) and the ``ctrctl plan`` step around the planner are in
:mod:`ctrctl.planning`. ``inference.py`` is the serving cost mode (quantized tables, one
request, no optimizer state, no backward) that ``ctrctl quantize --shards N`` plans with.

Example:
    >>> from ctrctl.distributed.planner import EmbeddingShardingPlanner, TableSpec, Topology
    >>> topo = Topology.preset("h100", world_size=64, local_world_size=8)
    >>> result = EmbeddingShardingPlanner(topo, batch_size=512).plan(
    ...     [TableSpec("C1", 40_000_000, 128), TableSpec("C2", 39_060, 128)])
    >>> result.plan.save("plan.json")
"""

from __future__ import annotations

from ctrctl.distributed.planner.capacity import (
    SweepPoint,
    smallest_world_size,
    sweep_world_sizes,
)
from ctrctl.distributed.planner.inference import (
    InferenceEstimator,
    serving_planner,
    serving_table,
    serving_topology,
)
from ctrctl.distributed.planner.planner import (
    EmbeddingShardingPlanner,
    PlanResult,
    plan_tables,
    rate_plan,
)
from ctrctl.distributed.planner.stats import plan_summary, rank_rows, table_rows
from ctrctl.distributed.planner.tables import (
    tables_from_dict,
    tables_from_manifest,
    tables_from_yaml,
)
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import ShardingOption, TableConstraints, TableSpec

__all__ = [
    "EmbeddingShardingPlanner",
    "InferenceEstimator",
    "PlanResult",
    "ShardingOption",
    "SweepPoint",
    "TableConstraints",
    "TableSpec",
    "Topology",
    "plan_summary",
    "plan_tables",
    "rank_rows",
    "rate_plan",
    "serving_planner",
    "serving_table",
    "serving_topology",
    "smallest_world_size",
    "sweep_world_sizes",
    "table_rows",
    "tables_from_dict",
    "tables_from_manifest",
    "tables_from_yaml",
]
