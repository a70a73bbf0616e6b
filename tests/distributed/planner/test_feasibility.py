"""Never a false "no plan": refusals proven by sums before any search, the plan the greedy order
missed when replicas crowded the ranks, and a brute force over tiny cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrctl.distributed.planner import (
    EmbeddingShardingPlanner,
    TableConstraints,
    TableSpec,
    Topology,
)
from ctrctl.distributed.planner.types import Placement, Proposer, ShardingOption
from ctrctl.errors import PlanError

from .helpers import assert_plan_respects

GIB = 1024**3


class CountingProposer(Proposer):
    """Counts the searches it is asked for and places nothing."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, options: list[list[ShardingOption]]) -> list[Placement] | None:
        self.calls += 1
        return None


def test_tables_beyond_all_ranks_are_refused_without_search() -> None:
    # 100 tables of 5 GiB (+ state): each fits one rank, all of them fit no 2 ranks.
    tables = [TableSpec(f"t{i}", 10_000_000, 128) for i in range(100)]
    proposer = CountingProposer()
    planner = EmbeddingShardingPlanner(Topology.preset("torchrec", 2, 2), 512,
                                       proposers=[proposer])
    with pytest.raises(PlanError) as info:
        planner.plan(tables)
    assert proposer.calls == 0
    text = info.value.render()
    assert "100 tables need at least" in text and "use at least" in text and "ranks" in text


def test_a_table_that_fits_no_rank_is_refused_without_search() -> None:
    fused = TableConstraints(compute_kernels=("fused",))
    tables = [TableSpec("huge", 200_000_000, 128, constraints=fused),
              TableSpec("small", 1000, 128)]
    proposer = CountingProposer()
    planner = EmbeddingShardingPlanner(Topology.preset("a100-40", 2, 2), 512,
                                       sharding_types=("table_wise", "column_wise"),
                                       proposers=[proposer])
    with pytest.raises(PlanError) as info:
        planner.plan(tables)
    assert proposer.calls == 0
    assert "'huge'" in info.value.render() and "more hbm" in info.value.render()


def test_buffers_beyond_device_memory_are_refused_without_search() -> None:
    # At 65,536 samples per rank on 8 ranks each table's input and output buffers take
    # about 0.5 GiB of device memory whatever its option (a replica's on every rank, a
    # shard's for all 8 ranks' samples): 150 tables need more than 8 x 6.8 GiB.
    tables = [TableSpec(f"t{i}", 1000, 64) for i in range(150)]
    proposer = CountingProposer()
    planner = EmbeddingShardingPlanner(Topology.preset("h100", 8, 8, hbm_bytes=8 * GIB),
                                       65536, proposers=[proposer])
    with pytest.raises(PlanError, match="of hbm"):
        planner.plan(tables)
    assert proposer.calls == 0


def test_replicas_crowding_the_ranks_no_longer_mean_no_plan() -> None:
    # Scaled down from 10,000 tables on 4,096 ranks: 300 small tables on 16 ranks with
    # little device memory. The greedy search replicates small tables and keeps weights
    # in device memory until nothing else fits; the plan needs leaner options for some.
    rng = np.random.default_rng(0)
    rows = np.exp(rng.uniform(np.log(1e2), np.log(1e6), 300)).astype(int)
    tables = [TableSpec(f"t{i}", int(r), 64) for i, r in enumerate(rows)]
    topo = Topology.preset("h100", 16, 8, hbm_bytes=1 * GIB)
    result = EmbeddingShardingPlanner(topo, 1024).plan(tables)
    assert_plan_respects(result, tables, topo)


# ---- brute force on tiny cases ----------------------------------------------------------
def _placements(option: ShardingOption, topo: Topology) -> list[tuple[int, ...]]:
    """Every placement of the option's shards (equal shards: rank multisets)."""
    world, local = topo.world_size, topo.local_world_size
    if option.fixed_ranks is not None and not option.host_local:
        return [tuple(option.fixed_ranks.tolist())]
    if option.fixed_ranks is not None:
        return [tuple((h * local + option.fixed_ranks).tolist()) for h in range(world // local)]
    groups = ([list(range(h * local, (h + 1) * local)) for h in range(world // local)]
              if option.host_local else [list(range(world))])
    return [combo for group in groups
            for combo in itertools.combinations_with_replacement(group, option.num_shards)]


def brute_force_fits(options: list[list[ShardingOption]], topo: Topology) -> bool:
    """Whether some choice of one enumerated option per table and ranks for its shards fits
    every rank's memory."""
    choices = []
    for opts in options:
        table_choices = []
        for option in opts:
            option.ensure_priced()
            for ranks in _placements(option, topo):
                hbm = np.zeros(topo.world_size)
                ddr = np.zeros(topo.world_size)
                np.add.at(hbm, list(ranks), option.hbm)
                np.add.at(ddr, list(ranks), option.ddr)
                table_choices.append((hbm, ddr))
        choices.append(table_choices)
    hbm_cap, ddr_cap = topo.hbm_available, topo.ddr_available

    def search(i: int, hbm: np.ndarray, ddr: np.ndarray) -> bool:
        if i == len(choices):
            return True
        for h, d in choices[i]:
            nh, nd = hbm + h, ddr + d
            if (nh <= hbm_cap).all() and (nd <= ddr_cap).all() and search(i + 1, nh, nd):
                return True
        return False

    zeros = np.zeros(topo.world_size)
    return search(0, zeros, zeros)


@st.composite
def tiny_cases(draw: st.DrawFn) -> tuple[list[TableSpec], int, int, float]:
    world = draw(st.sampled_from([2, 3, 4]))
    local = draw(st.sampled_from([w for w in (1, 2, world) if world % w == 0]))
    fused = TableConstraints(compute_kernels=("fused", "dense"))
    tables = [TableSpec(f"t{i}", draw(st.integers(1_000, 2_000_000)), 32,
                        pooling_factor=draw(st.floats(1, 5)), constraints=fused)
              for i in range(draw(st.integers(3, 5)))]
    return tables, world, local, draw(st.floats(0.4, 1.6))


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(tiny_cases())
def test_no_plan_only_when_brute_force_finds_none(case: tuple[list[TableSpec], int, int,
                                                               float]) -> None:
    tables, world, local, tightness = case
    loose = Topology.preset("torchrec", world, local)
    options = EmbeddingShardingPlanner(loose, 64).enumerate(tables)
    # Device memory around what the tables need at their leanest: some cases fit only by a
    # careful packing, some do not fit at all.
    need = sum(min(float(o.ensure_priced().hbm.sum()) for o in opts) for opts in options)
    hbm = need / world * tightness / (1 - loose.reserved_fraction)
    topo = Topology.preset("torchrec", world, local, hbm_bytes=hbm)
    planner = EmbeddingShardingPlanner(topo, 64)
    try:
        result = planner.plan(tables)
    except PlanError:
        assert not brute_force_fits(planner.enumerate(tables), topo), \
            "the planner said no plan, brute force found one"
        return
    assert_plan_respects(result, tables, topo)
