"""Realistic scale: Criteo 1TB on 512 GPUs and 1,000 tables on 4,096 ranks, each under 10 s."""

from __future__ import annotations

import time

import pytest

from ctrctl.distributed.planner import EmbeddingShardingPlanner, Topology
from ctrctl.distributed.planner.suites import criteo_1tb, random_tables

from .helpers import assert_plan_respects


@pytest.mark.slow
@pytest.mark.parametrize(("name", "world"), [("criteo-1tb", 512), ("random-1000", 4096)])
def test_plans_at_scale_in_under_ten_seconds(name: str, world: int) -> None:
    tables = criteo_1tb(128) if name == "criteo-1tb" else random_tables(1000)
    topo = Topology.preset("torchrec", world, 8)
    start = time.perf_counter()
    result = EmbeddingShardingPlanner(topo, batch_size=512).plan(tables)
    seconds = time.perf_counter() - start
    assert seconds < 10, seconds
    assert_plan_respects(result, tables, topo)
    assert len(result.plan.ranks) == world
