"""The CPU disk tier (``fused_cached``) in the planner: priced by load factor, used when needed."""

from __future__ import annotations

import pytest

from ctrctl.distributed.planner import (
    EmbeddingShardingPlanner,
    TableConstraints,
    TableSpec,
    Topology,
)
from ctrctl.distributed.planner.enumerators import EmbeddingEnumerator

GIB = 1024**3


def _cpu(ddr_gib: float, world: int = 1) -> Topology:
    return Topology.preset("cpu", world_size=world, local_world_size=world,
                           ddr_bytes=ddr_gib * GIB)


def test_cached_kernel_is_priced_in_dram_by_load_factor_and_on_disk_in_full() -> None:
    table = TableSpec("t", 10_000_000, 64, optimizer="rowwise_adagrad",
                      constraints=TableConstraints(compute_kernels=("fused", "fused_cached"),
                                                   cache_load_factor=0.1))
    options = EmbeddingEnumerator(_cpu(64), batch_size=512).enumerate(table)
    tw = {o.compute_kernel: o.ensure_priced() for o in options if o.sharding_type == "table_wise"}
    whole = 10_000_000 * (64 * 4 + 4)  # weights and one float per row
    io = tw["fused"].ddr[0] - whole
    assert tw["fused_cached"].ddr[0] == pytest.approx(0.1 * whole + io, abs=1)
    assert tw["fused_cached"].disk[0] == whole and tw["fused"].disk.size == 0
    assert tw["fused"].fwd_compute[0] < tw["fused_cached"].fwd_compute[0]


def test_a_table_that_fits_no_rank_is_planned_cached() -> None:
    huge = TableSpec("huge", 120_000_000, 64)  # ~29 GiB with its optimizer state
    small = TableSpec("small", 1000, 64)
    plan = EmbeddingShardingPlanner(_cpu(24), 4096).plan([huge, small]).plan
    assert plan.tables["huge"].compute_kernel == "fused_cached"
    assert plan.tables["small"].compute_kernel == "fused"  # fitting tables stay resident
    # the sharder keeps this share of each block in DRAM (tests/distributed/pipeline/
    # test_cached_sharded.py trains sharded cached tables)
    assert 0 < (plan.tables["huge"].cache_load_factor or 0) < 1
    # With memory enough the tier is not offered at all.
    options = EmbeddingEnumerator(_cpu(64), batch_size=4096).enumerate(huge)
    assert {o.compute_kernel for o in options} == {"fused"}
