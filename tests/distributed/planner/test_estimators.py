"""The cost and storage model against hand-computed formulas."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from torch.testing import assert_close

from ctrctl.distributed.planner import (
    EmbeddingShardingPlanner,
    TableConstraints,
    TableSpec,
    Topology,
    rate_plan,
)
from ctrctl.distributed.planner.enumerators import (
    EmbeddingEnumerator,
    column_block_counts,
)
from ctrctl.distributed.planner.estimators import (
    PIPELINE_DEPTH,
    kernel_bandwidth,
    slowest_rank_time,
    step_overhead,
)
from ctrctl.distributed.planner.types import ShardingOption
from ctrctl.distributed.types import row_blocks
from ctrctl.errors import PlanError

GIB = 1024**3


def _option(options, kind, kernel="fused", shards=None):
    for o in options:
        if o.sharding_type == kind and o.compute_kernel == kernel and (
                shards is None or o.num_shards == shards):
            return o.ensure_priced()
    raise AssertionError(f"no {kind}/{kernel} option among {[o.label for o in options]}")


def test_table_wise_cost_matches_hand_formula() -> None:
    topo = Topology.preset("torchrec", world_size=16, local_world_size=8)
    table = TableSpec("t", 1_000_000, 128, pooling_factor=3.0)
    option = _option(EmbeddingEnumerator(topo, batch_size=512).enumerate(table), "table_wise")
    g = 512 * 16  # samples in a step
    lookup = g * 3 * 8 + g * 3 * 128 * 4 + g * 128 * 4  # ids + rows read + pooled written
    hbm_bw = 897 * GIB
    assert_close(option.fwd_compute[0], lookup / hbm_bw)
    assert_close(option.bwd_compute[0], 2 * lookup / hbm_bw)
    # all-to-all: 7 of 15 peers on the host (600 GiB/s), 8 across hosts (12.5 GiB/s)
    share = 7 / 15
    bw = 1 / (share / (600 * GIB) + (1 - share) / (12.5 * GIB))
    remote = 15 / 16
    assert_close(option.fwd_comms[0], (g * 3 * 8 + g * 128 * 4) * remote / bw)
    assert_close(option.bwd_comms[0], g * 128 * 4 * remote / bw)
    weights = 1_000_000 * 128 * 4 + 1_000_000 * 4  # rowwise adagrad: one float per row
    io = PIPELINE_DEPTH * (g * 3 * 8 + 2 * g * 128 * 4)
    assert option.hbm[0] == weights + io
    assert option.ddr[0] == 0


@pytest.mark.parametrize(("optimizer", "state_per_row"),
                         [("sgd", 0), ("rowwise_adagrad", 4), ("adagrad", 64 * 4),
                          ("adam", 2 * 64 * 4)])
def test_optimizer_state_counts(optimizer: str, state_per_row: int) -> None:
    topo = Topology.preset("cpu", world_size=1)
    table = TableSpec("t", 10_000, 64, optimizer=optimizer)
    option = _option(EmbeddingEnumerator(topo, batch_size=1).enumerate(table), "table_wise")
    io = PIPELINE_DEPTH * (1 * 8 + 2 * 64 * 4)
    assert option.ddr[0] == 10_000 * (64 * 4 + state_per_row) + io
    assert option.hbm[0] == 0  # a cpu rank keeps tables in host memory


def test_row_wise_splits_lookups_but_not_outputs() -> None:
    topo = Topology.preset("torchrec", world_size=8)
    table = TableSpec("t", 1003, 64, pooling_factor=2.0)
    options = EmbeddingEnumerator(topo, batch_size=100).enumerate(table)
    rw = _option(options, "row_wise")
    assert rw.rows.tolist() == [126] * 7 + [121]  # ceil(1003 / 8) = 126
    assert rw.row_offsets.tolist() == [126 * i for i in range(8)]
    g = 800
    ids = g * 2.0 * rw.rows / 1003
    expected = (ids * 8 + ids * 64 * 4 + g * 64 * 4) / (897 * GIB / 1.15)  # half-block dim
    assert_close(rw.fwd_compute, expected)
    # row-wise stores the table once, split: weights sum to the whole table
    assert int((rw.rows * rw.cols).sum()) == 1003 * 64


def test_cached_kernel_keeps_a_share_on_device() -> None:
    topo = Topology.preset("torchrec", world_size=2)
    table = TableSpec("t", 1_000_000, 128, optimizer="sgd")
    options = EmbeddingEnumerator(topo, batch_size=10).enumerate(table)
    fused = _option(options, "table_wise", "fused")
    cached = _option(options, "table_wise", "fused_uvm_caching")
    uvm = _option(options, "table_wise", "fused_uvm")
    weights = 1_000_000 * 128 * 4
    io = fused.hbm[0] - weights
    assert cached.hbm[0] == pytest.approx(0.2 * weights + io, abs=1)
    assert cached.ddr[0] == weights and uvm.ddr[0] == weights and uvm.hbm[0] == io
    assert fused.fwd_compute[0] < cached.fwd_compute[0] < uvm.fwd_compute[0]


def test_data_parallel_pays_all_reduce_of_the_table() -> None:
    topo = Topology.preset("torchrec", world_size=4)
    table = TableSpec("t", 5_000, 64)
    enum = EmbeddingEnumerator(topo, batch_size=64, sharding_types=("data_parallel",))
    dp = _option(enum.enumerate(table), "data_parallel",
                 "dense")
    assert dp.num_shards == 4 and dp.fixed_ranks is not None
    assert_close(dp.fwd_comms, np.zeros(4))
    assert_close(dp.bwd_comms, np.full(4, 2 * 3 / 4 * 5_000 * 64 * 4 / (600 * GIB)))


def test_geometry_helpers() -> None:
    assert row_blocks(10, 4) == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert row_blocks(3, 8) == [(0, 1), (1, 1), (2, 1)]  # ranks past the last row hold nothing
    assert column_block_counts(64, 32, 8) == [2]
    assert column_block_counts(512, 128, 8) == [2, 4]
    assert column_block_counts(384, 128, 8) == [2, 3]  # 3: TorchRec's width, 128
    assert column_block_counts(128, 128, 8) == []


def test_calibrated_bandwidth_interpolates_by_dim() -> None:
    topo = Topology.preset("cpu", world_size=1, kernel_fwd_bw={"32": 1e9, "128": 3e9},
                           kernel_bwd_bw={"32": 0.5e9, "128": 1.5e9})
    got = kernel_bandwidth(topo, "fused", np.array([16, 32, 64, 128, 256]), None)
    assert_close(got, np.array([1e9, 1e9, 2e9, 3e9, 3e9]))
    back = kernel_bandwidth(topo, "fused", np.array([64]), None, backward=True)
    assert_close(back, np.array([1e9]))


def test_calibrated_bandwidth_interpolates_by_table_size() -> None:
    topo = Topology.preset("cpu", world_size=1, kernel_fwd_bw={"64": 1e9},
                           kernel_bwd_bw={"64": 1e9}, kernel_fwd_bw_cached={"64": 4e9},
                           kernel_bwd_bw_cached={"64": 2e9},
                           kernel_table_bytes=(2.0**20, 2.0**26))
    sizes = np.array([2.0**10, 2.0**20, 2.0**23, 2.0**26, 2.0**30])
    got = kernel_bandwidth(topo, "fused", np.full(5, 64), None, shard_bytes=sizes)
    # seconds per byte half-way between the two in log(size) at 8 MiB
    assert_close(got, np.array([4e9, 4e9, 1 / (0.5 / 4e9 + 0.5 / 1e9), 1e9, 1e9]))
    back = kernel_bandwidth(topo, "fused", np.array([64]), None, backward=True,
                            shard_bytes=np.array([1.0]))
    assert_close(back, np.array([2e9]))
    # a small table's lookups are cheaper per byte than a large one's
    enum = EmbeddingEnumerator(topo, batch_size=256)
    small = _option(enum.enumerate(TableSpec("s", 1_000, 64)), "table_wise")
    large = _option(enum.enumerate(TableSpec("l", 1_000_000, 64)), "table_wise")
    assert small.fwd_compute[0] < large.fwd_compute[0]


def test_pooled_output_handling_and_dense_update_use_calibrated_rates() -> None:
    table = TableSpec("t", 10_000, 64, pooling_factor=2.0)
    plain = Topology.preset("cpu", world_size=2, local_world_size=2)
    measured = Topology.preset("cpu", world_size=2, local_world_size=2,
                               pooled_output_bw={"table_wise": 1e9}, dense_update_bw=2e9)
    batch = 100

    def priced(topo: Topology, kind: str) -> ShardingOption:
        enum = EmbeddingEnumerator(topo, batch_size=batch, sharding_types=(kind,))
        return _option(enum.enumerate(table), kind, "dense" if kind == "data_parallel"
                       else "fused")

    base, handled = priced(plain, "table_wise"), priced(measured, "table_wise")
    pooled_bytes = 2 * batch * 64 * 4  # the global batch's pooled vectors
    assert_close(handled.fwd_compute - base.fwd_compute, np.array([0.5 * pooled_bytes / 1e9]))
    assert_close(handled.bwd_compute - base.bwd_compute, np.array([0.5 * pooled_bytes / 1e9]))
    assert_close(handled.fwd_comms, base.fwd_comms)
    # other types keep their cost: the figure is per type
    assert_close(priced(measured, "column_wise").fwd_compute,
                 priced(plain, "column_wise").fwd_compute)
    dp_base, dp = priced(plain, "data_parallel"), priced(measured, "data_parallel")
    update = 10_000 * 64 * 4 * 3 + 8 * 10_000  # weight, gradient, weight; row-wise state
    lookup_bwd = dp_base.bwd_compute - update / kernel_bandwidth(
        plain, "dense", np.array([64]), None, backward=True)
    assert_close(dp.bwd_compute, lookup_bwd + update / 2e9)


def test_ranks_sharing_a_host_add_up() -> None:
    # per rank: fwd compute, bwd compute, fwd comms, bwd comms (seconds)
    lopsided = np.array([[2.0, 2.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    balanced = np.array([[1.0, 1.0, 0.5, 0.5], [1.0, 1.0, 0.5, 0.5]])
    gpus = Topology.preset("torchrec", world_size=2, local_world_size=2)
    assert slowest_rank_time(lopsided, gpus) == 6.0
    assert slowest_rank_time(balanced, gpus) == 3.0
    # one rank's worth at once: the host's compute adds up, its communication is shared
    shared = Topology.preset("cpu", world_size=2, local_world_size=2, host_parallelism=1.0)
    assert shared.parallel_ranks == 1.0
    assert slowest_rank_time(balanced, shared) == 4.0 + 1.0
    assert slowest_rank_time(lopsided, shared) == 6.0  # the busy rank is slower still
    # two hosts of one rank each: nothing shares, whatever the figure
    apart = Topology.preset("cpu", world_size=2, local_world_size=1, host_parallelism=1.0)
    assert apart.parallel_ranks == 1.0 and slowest_rank_time(balanced, apart) == 3.0
    with pytest.raises(PlanError, match="host_parallelism"):
        Topology.preset("cpu", world_size=2, host_parallelism=0.0)


def test_plan_rating_sees_ranks_sharing_cores() -> None:
    tables = [TableSpec(f"t{i}", 20_000, 64, pooling_factor=4.0) for i in range(4)]
    for parallel, cheaper_when_spread in ((None, True), (1.0, False)):
        topo = Topology.preset("cpu", 2, 2, host_parallelism=parallel)
        spread = EmbeddingShardingPlanner(topo, 1024, ("table_wise",)).plan(tables)
        pinned = [dataclasses.replace(t, constraints=TableConstraints(ranks=(0,)))
                  for t in tables]
        one_rank = EmbeddingShardingPlanner(topo, 1024, ("table_wise",)).plan(pinned)
        rated = rate_plan(one_rank.plan, tables, topo, 1024)
        assert rated.step_time == pytest.approx(one_rank.step_time)
        assert (spread.step_time < 0.75 * one_rank.step_time) == cheaper_when_spread
        assert one_rank.plan.metadata["estimated_step_seconds"] == pytest.approx(
            one_rank.step_time)


def test_several_sharding_types_pay_for_putting_outputs_together() -> None:
    topo = Topology.preset("cpu", 2, 2, sharding_overhead_s={"table_wise": 1e-3,
                                                             "data_parallel": 2e-4},
                           group_assembly_bw=1e9)
    one = step_overhead({"table_wise": 3}, topo, pooled_bytes=4e6)
    two = step_overhead({"table_wise": 2, "data_parallel": 1}, topo, pooled_bytes=4e6)
    assert one == pytest.approx(1e-3)
    assert two == pytest.approx(1e-3 + 2e-4 + 4e6 / 1e9)
    tables = [TableSpec(f"t{i}", 1_000, 64) for i in range(3)]
    result = EmbeddingShardingPlanner(topo, 256).plan(tables)
    assert all(p.option.pooled_bytes == 256 * 64 * 4 for p in result.placements)
