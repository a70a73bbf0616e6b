"""The planner: valid plans within capacity and constraints, quality, errors, capacity."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ctrctl.distributed.planner import (
    EmbeddingShardingPlanner,
    TableConstraints,
    TableSpec,
    Topology,
    plan_summary,
    rate_plan,
    smallest_world_size,
    sweep_world_sizes,
)
from ctrctl.distributed.planner.enumerators import EmbeddingEnumerator
from ctrctl.distributed.planner.estimators import EmbeddingPerfEstimator, step_overhead
from ctrctl.distributed.planner.partitioners import RankState, best_placement
from ctrctl.distributed.planner.suites import criteo_1tb, few_huge_many_small, skewed, uniform
from ctrctl.distributed.planner.types import Placement, Proposer, ShardingOption
from ctrctl.distributed.types import ShardingPlan
from ctrctl.errors import PlanError
from ctrctl.names import ShardingType

from .helpers import assert_plan_respects

GIB = 1024**3


@pytest.mark.parametrize("world", [8, 64])
def test_criteo_1tb_plans_fast_and_fits(world: int) -> None:
    tables = criteo_1tb(128)
    topo = Topology.preset("torchrec", world, 8)
    start = time.perf_counter()
    result = EmbeddingShardingPlanner(topo, batch_size=512).plan(tables)
    assert time.perf_counter() - start < 10
    assert_plan_respects(result, tables, topo)
    # four 40M x 128 tables are 19 GiB each: at most one fits a 27 GiB rank whole
    big = [ps for name, ps in result.plan.tables.items() if ps.num_embeddings == 40_000_000]
    for ps in big:
        if ps.sharding_type == "table_wise" and ps.compute_kernel == "fused":
            others = [q for q in big if q is not ps and q.ranks == ps.ranks
                      and q.compute_kernel == "fused"]
            assert not others


@pytest.mark.parametrize("kind", [t.value for t in ShardingType])
def test_forced_sharding_type_is_used_everywhere(kind: str) -> None:
    tables = [TableSpec(f"t{i}", 1000 * (i + 1), 64, pooling_factor=1 + i) for i in range(6)]
    topo = Topology.preset("cpu", world_size=4, local_world_size=2)
    result = EmbeddingShardingPlanner(topo, batch_size=256, sharding_types=(kind,)).plan(tables)
    assert_plan_respects(result, tables, topo, forced_type=kind)


def test_constraints_are_respected() -> None:
    tables = [
        TableSpec("pinned", 50_000, 64, constraints=TableConstraints(ranks=(2, 3))),
        TableSpec("cw", 80_000, 256, pooling_factor=20,
                  constraints=TableConstraints(sharding_types=("column_wise",),
                                               min_col_block=128)),
        TableSpec("cached", 2_000_000, 128,
                  constraints=TableConstraints(compute_kernels=("fused_uvm_caching",),
                                               cache_load_factor=0.05)),
        *[TableSpec(f"t{i}", 10_000, 64) for i in range(10)],
    ]
    topo = Topology.preset("a100-40", world_size=4, local_world_size=4)
    result = EmbeddingShardingPlanner(topo, batch_size=512).plan(tables)
    assert_plan_respects(result, tables, topo)
    assert result.plan.tables["cached"].cache_load_factor == 0.05
    assert all(s.cols == 128 for s in result.plan.tables["cw"].shards)


def test_deterministic() -> None:
    tables = skewed(30, seed=5)
    topo = Topology.preset("h100", 16, 8)
    a = EmbeddingShardingPlanner(topo, 1024).plan(tables).plan.to_dict()
    b = EmbeddingShardingPlanner(topo, 1024).plan(tables).plan.to_dict()
    a["metadata"].pop("planning_seconds")
    b["metadata"].pop("planning_seconds")
    assert a == b


def test_plan_round_trips_and_rates_the_same(tmp_path) -> None:
    tables = few_huge_many_small(20, 2)
    topo = Topology.preset("torchrec", 8, 8)
    result = EmbeddingShardingPlanner(topo, 512).plan(tables)
    path = result.plan.save(tmp_path / "plan.json")
    loaded = ShardingPlan.load(path)
    rated = rate_plan(loaded, tables, topo, 512)
    assert rated.step_time == pytest.approx(result.step_time, rel=1e-9)
    assert loaded.metadata["estimated_step_seconds"] == pytest.approx(result.step_time)
    assert len(loaded.ranks) == 8 and loaded.ranks[0]["hbm_capacity"] > 0


def _fastest_option_greedy(tables: list[TableSpec], topo: Topology, batch: int) -> float:
    """TorchRec's first proposal: each table's fastest option, most expensive first, on the
    least-loaded rank that has room."""
    enum = EmbeddingEnumerator(topo, batch)
    choices = [min(enum.enumerate(t), key=lambda o: o.total_cost) for t in tables]
    choices.sort(key=lambda o: -o.total_cost)
    state, placements = RankState(topo), []
    for option in choices:
        placement = best_placement(state, option)
        assert placement is not None
        state.add(placement)
        placements.append(placement)
    load = [0.0] * topo.world_size
    for p in placements:
        for r, c in zip(p.ranks.tolist(), p.option.cost.tolist(), strict=True):
            load[r] += c
    return max(load) + step_overhead([p.option.sharding_type for p in placements], topo)


@pytest.mark.parametrize(("name", "tables", "world", "strictly"), [
    ("uniform", uniform(26, 1_000_000), 8, False),
    ("skewed", skewed(40), 8, True),
    ("skewed", skewed(40), 16, True),
    ("huge+small", few_huge_many_small(60, 4), 8, False),  # one busy table-wise rank wins
    ("huge+small", few_huge_many_small(60, 4), 16, True),
    ("huge+small", few_huge_many_small(20, 8), 64, True),
])
def test_beats_fastest_option_greedy(name: str, tables: list[TableSpec], world: int,
                                     strictly: bool) -> None:
    topo = Topology.preset("torchrec", world, 8)
    ours = EmbeddingShardingPlanner(topo, 512).plan(tables).step_time
    baseline = _fastest_option_greedy(tables, topo, 512)
    assert ours <= baseline * (1 + 1e-9), (name, ours, baseline)
    if strictly:
        assert ours < 0.97 * baseline, (name, ours, baseline)


def test_no_fit_says_which_table_and_what_helps() -> None:
    tables = [TableSpec("huge", 200_000_000, 128), TableSpec("small", 1000, 128)]
    topo = Topology.preset("a100-40", world_size=2, local_world_size=2)
    with pytest.raises(PlanError) as info:
        EmbeddingShardingPlanner(topo, 512, sharding_types=("table_wise", "row_wise"),
                                 ).plan([TableSpec("huge", 200_000_000, 128,
                                                   constraints=TableConstraints(
                                                       compute_kernels=("fused",))),
                                         tables[1]])
    text = info.value.render()
    assert "'huge'" in text and "GiB" in text
    assert "ranks" in text and "more hbm" in text
    assert "fused_uvm_caching" in text  # the kernel it could allow


def test_smallest_world_size_and_sweep() -> None:
    fused = TableConstraints(compute_kernels=("fused",))  # no host-memory kernels
    tables = [TableSpec(f"t{i}", 30_000_000, 128, constraints=fused)
              for i in range(6)]  # 14.4 GiB each, 13.6 GiB free per rank
    topo = Topology.preset("torchrec", 8, 8, hbm_bytes=16 * GIB)
    fit = smallest_world_size(tables, topo, batch_size=512,
                              sharding_types=("table_wise", "row_wise"))
    world = fit.topology.world_size
    assert world > 1
    with pytest.raises(PlanError):
        smallest_world_size(tables, topo, 512, max_world_size=world - 1,
                            sharding_types=("table_wise", "row_wise"))
    points = sweep_world_sizes(tables, topo, 512, [world, 2 * world],
                               sharding_types=("table_wise", "row_wise"))
    assert all(p.fits for p in points)
    assert points[0].step_time > 0 and points[0].fullest_fraction <= 1.0


def test_summary_names_the_drivers() -> None:
    tables = few_huge_many_small(10, 2)
    result = EmbeddingShardingPlanner(Topology.preset("h100", 8), 512).plan(tables)
    summary = plan_summary(result)
    assert summary["imbalance"] >= 1.0
    top = summary["top_tables_slowest_rank"]
    assert top and top[0]["cost"] >= top[-1]["cost"]
    assert summary["estimated_step_seconds"] == pytest.approx(result.step_time)


class _EverythingOnLastRank(Proposer):
    """A custom search: every table whole (table-wise, fastest kernel) on the last rank."""

    def __init__(self, rank: int):
        self.rank = rank
        self.calls = 0

    def propose(self, options: list[list[ShardingOption]]) -> list[Placement] | None:
        self.calls += 1
        chosen = [min((o for o in opts if o.sharding_type == "table_wise"),
                      key=lambda o: o.ensure_priced().total_cost) for opts in options]
        return [Placement(o, np.array([self.rank])) for o in chosen]


def test_a_custom_proposer_is_used_and_its_plan_kept() -> None:
    topo = Topology.preset("cpu", 4)
    tables = [TableSpec(f"t{i}", 1_000 * (i + 1), 16) for i in range(5)]
    proposer = _EverythingOnLastRank(3)
    result = EmbeddingShardingPlanner(topo, batch_size=256, local_search=False,
                                      proposers=[proposer]).plan(tables)
    assert proposer.calls == 1
    for name in (t.name for t in tables):
        entry = result.plan.tables[name]
        assert entry.sharding_type == "table_wise"
        assert [s.rank for s in entry.shards] == [3]
    assert result.rank_total[:3].sum() == 0 and result.rank_total[3] > 0
    # the default proposers spread the same tables
    default = EmbeddingShardingPlanner(topo, batch_size=256).plan(tables)
    assert len({s.rank for e in default.plan.tables.values() for s in e.shards}) > 1


def test_a_custom_estimator_prices_every_option() -> None:
    topo = Topology.preset("cpu", 2)
    priced: list[str] = []

    class Counting(EmbeddingPerfEstimator):
        def estimate(self, options: list[ShardingOption]) -> list[ShardingOption]:
            priced.extend(o.sharding_type for o in options)
            return super().estimate(options)

    tables = [TableSpec("a", 5_000, 16), TableSpec("b", 50, 16)]
    result = EmbeddingShardingPlanner(topo, batch_size=256,
                                      estimator=Counting(topo, 256)).plan(tables)
    assert set(result.plan.tables) == {"a", "b"}
    assert "table_wise" in priced and "row_wise" in priced
