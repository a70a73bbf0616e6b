"""The cost and storage model against hand-computed formulas."""

from __future__ import annotations

import numpy as np
import pytest
from torch.testing import assert_close

from ctrctl.distributed.planner import TableSpec, Topology
from ctrctl.distributed.planner.enumerators import (
    EmbeddingEnumerator,
    column_block_counts,
    row_blocks,
)
from ctrctl.distributed.planner.estimators import PIPELINE_DEPTH, kernel_bandwidth

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
    assert row_blocks(10, 4).tolist() == [3, 3, 3, 1]
    assert row_blocks(3, 8).tolist() == [1, 1, 1]  # ranks past the last row hold nothing
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
