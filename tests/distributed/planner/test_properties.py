"""Property tests: over random table sets, topologies and constraints, every plan the planner
returns fits and obeys; and when it refuses, it says so with a PlanError."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrctl.distributed.planner import (
    EmbeddingShardingPlanner,
    TableConstraints,
    TableSpec,
    Topology,
)
from ctrctl.errors import PlanError
from ctrctl.names import ShardingType

from .helpers import assert_plan_respects

GIB = 1024**3
TYPES = [t.value for t in ShardingType]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[TableSpec], Topology, int]:
    hosts = draw(st.integers(1, 3))
    local = draw(st.sampled_from([1, 2, 4]))
    world = hosts * local
    device = draw(st.sampled_from(["cpu", "torchrec"]))
    memory_gib = draw(st.floats(0.05, 4.0))
    # a CPU host whose ranks share cores (calibrated) or do not (the preset)
    parallel = draw(st.sampled_from([None, 0.7, 1.5])) if device == "cpu" else None
    topo = Topology.preset(device, world, local, hbm_bytes=memory_gib * GIB,
                           ddr_bytes=4 * memory_gib * GIB, host_parallelism=parallel)
    tables = []
    for i in range(draw(st.integers(1, 12))):
        dim = draw(st.sampled_from([8, 16, 32, 64, 128, 256]))
        constraints = TableConstraints()
        if draw(st.booleans()):
            allowed = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3,
                                    unique=True))
            pinned = None
            if draw(st.booleans()) and world > 1:
                pinned = tuple(sorted(draw(st.sets(st.integers(0, world - 1), min_size=1))))
                # pinned to a few ranks, a table can always go there whole
                allowed = sorted({*allowed, "table_wise"})
            constraints = TableConstraints(
                sharding_types=tuple(allowed), ranks=pinned,
                min_col_block=draw(st.sampled_from([None, 4, 16, 32])))
        tables.append(TableSpec(
            f"t{i}", draw(st.integers(1, 3_000_000)), dim,
            pooling_factor=draw(st.floats(0.5, 50)),
            optimizer=draw(st.sampled_from(["sgd", "rowwise_adagrad", "adagrad", "adam"])),
            constraints=constraints))
    return tables, topo, draw(st.sampled_from([64, 512, 4096]))


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_plan_fits_and_obeys(scenario: tuple[list[TableSpec], Topology, int]) -> None:
    tables, topo, batch = scenario
    try:
        result = EmbeddingShardingPlanner(topo, batch).plan(tables)
    except PlanError as exc:
        assert exc.message  # a refusal names what did not fit
        return
    assert_plan_respects(result, tables, topo)
    assert result.step_time >= float(result.rank_total.max())
