"""Calibration measures this machine and the planner uses the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.distributed.planner import EmbeddingShardingPlanner, TableSpec, Topology
from ctrctl.modules import EmbeddingBagCollection, EmbeddingBagConfig
from ctrctl.names import ShardingType
from ctrctl.planning.calibration import (
    _kernel_name,
    _solve_increasing,
    calibrate,
    fit_latency_bandwidth,
    measure_kernels,
)


def test_kernel_measurement_is_positive_and_finite() -> None:
    k = measure_kernels(dims=(32, 64), table_bytes=(2.0**16, 2.0**22), batch=512, pooling=2,
                        repeats=2, rounds=1)
    figures = (k.fwd_bw, k.bwd_bw, k.fwd_bw_cached, k.bwd_bw_cached)
    assert all(set(f) == {"32", "64"} for f in figures)
    # bytes/s of a memory-bound kernel: above 100 kB/s even on a crowded machine, and below
    # 10 TB/s (which would mean a timing of nothing)
    assert all(1e5 < v < 1e13 for f in figures for v in f.values())


def test_kernel_benchmark_times_the_kernel_training_builds() -> None:
    """Calibration once timed FBGEMM's TBE after training had moved to the native kernel on
    CPU, and every calibrated estimate came out 2-6x too high."""
    trained = EmbeddingBagCollection([EmbeddingBagConfig("t", 1000, 64, ["f"])]).backends()
    assert _kernel_name().split()[0] == trained[0]


def test_latency_and_bandwidth_fit_a_line() -> None:
    sizes = [2.0**16, 2.0**19, 2.0**21, 2.0**23]
    latency, bandwidth = fit_latency_bandwidth(sizes, [1e-4 + n / 2e9 for n in sizes])
    assert latency == pytest.approx(1e-4, rel=1e-6)
    assert bandwidth == pytest.approx(2e9, rel=1e-6)
    # a negative intercept is noise: the line through the origin instead
    latency, bandwidth = fit_latency_bandwidth(sizes, [n / 1e9 - 1e-5 for n in sizes])
    assert latency == 0.0 and 0.9e9 < bandwidth < 1.1e9


def test_solve_increasing_finds_the_rate_that_reproduces_a_measurement() -> None:
    assert _solve_increasing(lambda x: 2.0 + 3e9 * x, 5.0) == pytest.approx(1e-9, rel=1e-6)
    assert _solve_increasing(lambda x: 2.0 + x, 1.0) == 0.0  # already slower: no extra cost


@pytest.mark.slow
@pytest.mark.distributed
def test_calibrate_writes_a_topology_the_planner_reads(tmp_path: Path) -> None:
    path = tmp_path / "topology.json"
    topo = calibrate(path, quick=True)
    assert topo.calibrated["seconds"] < 60
    assert set(topo.collective_bw) == {"all_to_all", "reduce_scatter", "all_gather",
                                       "all_reduce"}
    assert all(v > 0 for v in topo.collective_bw.values())
    assert topo.collective_latency_s > 0
    assert topo.host_parallelism is None or 1.0 <= topo.host_parallelism <= 2
    # the kernel timed is the one a training run on this machine builds
    trained = EmbeddingBagCollection([EmbeddingBagConfig("t", 1000, 64, ["f"])]).backends()
    assert topo.calibrated["kernel"].split()[0] == trained[0]
    assert set(topo.sharding_overhead_s) == {t.value for t in ShardingType}
    assert all(v > 0 for v in topo.pooled_output_bw.values())
    loaded = Topology.load(path, world_size=2)
    assert loaded.kernel_fwd_bw == topo.kernel_fwd_bw
    result = EmbeddingShardingPlanner(loaded, 1024).plan([TableSpec("t", 100_000, 64)])
    assert result.plan.topology["calibrated"]["seconds"] == topo.calibrated["seconds"]
