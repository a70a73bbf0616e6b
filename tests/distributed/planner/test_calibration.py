"""Calibration measures this machine and the planner uses the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.distributed.planner import EmbeddingShardingPlanner, TableSpec, Topology
from ctrctl.distributed.planner.calibration import calibrate, measure_kernels


def test_kernel_measurement_is_positive_and_finite() -> None:
    fwd, bwd = measure_kernels(dims=(32, 64), rows=20_000, batch=512, pooling=2, repeats=2)
    assert set(fwd) == set(bwd) == {"32", "64"}
    # bytes/s of a memory-bound kernel: above 100 kB/s even on a crowded machine, and below
    # 10 TB/s (which would mean a timing of nothing)
    assert all(1e5 < v < 1e13 for v in [*fwd.values(), *bwd.values()])


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
    loaded = Topology.load(path, world_size=2)
    assert loaded.kernel_fwd_bw == topo.kernel_fwd_bw
    result = EmbeddingShardingPlanner(loaded, 1024).plan([TableSpec("t", 100_000, 64)])
    assert result.plan.topology["calibrated"]["seconds"] == topo.calibrated["seconds"]
