"""Checks every plan must pass, computed from the plan's shards, not from the planner."""

from __future__ import annotations

from collections import defaultdict

from ctrctl.distributed.planner import PlanResult, TableSpec, Topology
from ctrctl.names import ShardingType

GIB = 1024**3


def table_dict(tables: list[TableSpec]) -> dict[str, tuple[int, int]]:
    return {t.name: (t.num_embeddings, t.embedding_dim) for t in tables}


def assert_plan_respects(result: PlanResult, tables: list[TableSpec], topo: Topology,
                         forced_type: str | None = None) -> None:
    """Valid geometry, every constraint, and memory within every rank's capacity.

    The memory check recomputes weights + optimizer state from the shards alone (a lower
    bound on what the planner must count), then checks the planner's own per-rank totals.
    """
    plan = result.plan
    plan.validate(table_dict(tables), world_size=topo.world_size)
    by_name = {t.name: t for t in tables}
    weights: dict[int, float] = defaultdict(float)
    for name, ps in plan.tables.items():
        table = by_name[name]
        c = table.constraints
        if forced_type:
            assert ps.sharding_type == forced_type, (name, ps.sharding_type)
        if c.sharding_types:
            assert ps.sharding_type in c.sharding_types, (name, ps.sharding_type)
        if c.compute_kernels:
            assert ps.compute_kernel in c.compute_kernels, (name, ps.compute_kernel)
        if c.ranks:
            assert set(ps.ranks) <= set(c.ranks), (name, ps.ranks, c.ranks)
        if ps.sharding_type in (ShardingType.COLUMN_WISE.value,
                                ShardingType.TABLE_COLUMN_WISE.value) and len(ps.shards) > 1:
            minimum = c.min_col_block or min(128, max(table.embedding_dim // 2, 4))
            for s in ps.shards:
                assert s.cols >= minimum and s.cols % 4 == 0, (name, s)
                assert table.embedding_dim % s.cols == 0, (name, s)
        if ps.sharding_type == ShardingType.TABLE_COLUMN_WISE.value:
            assert len({s.rank // topo.local_world_size for s in ps.shards}) == 1, name
        if ps.sharding_type in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value):
            block = max(s.rows for s in ps.shards)
            assert all(s.rows == block for s in sorted(
                ps.shards, key=lambda s: s.row_offset)[:-1]), name
        for s in ps.shards:
            state = {"sgd": 0, "rowwise_adagrad": s.rows, "adagrad": s.rows * s.cols,
                     "adam": 2 * s.rows * s.cols}[table.optimizer] * 4
            cached = ps.compute_kernel in ("fused_uvm_caching", "fused_uvm")
            full = s.rows * s.cols * table.element_bytes + state
            if ps.compute_kernel == "fused_cached":  # CPU: its cache's share in DRAM
                clf = (ps.cache_load_factor if ps.cache_load_factor is not None
                       else topo.cache_load_factor)
                weights[s.rank] += clf * full
            elif topo.device == "cpu" or not cached:
                weights[s.rank] += full
    capacity = topo.ddr_available if topo.device == "cpu" else topo.hbm_available
    for rank, used in weights.items():
        assert used <= capacity + 1, (rank, used / GIB, capacity / GIB)
    for row in plan.ranks:
        assert row["hbm_bytes"] <= topo.hbm_available + 1, row
        assert row["ddr_bytes"] <= topo.ddr_available + 1, row
