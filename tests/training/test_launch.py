"""Launch plumbing: the torchrun command line and the worker's spec."""

from __future__ import annotations

import sys

import pytest

from ctrctl.distributed.launch import torchrun_command
from ctrctl.errors import ConfigError
from ctrctl.training.launch import TrainSpec, worker_program


def test_single_node_is_standalone() -> None:
    spec = TrainSpec(dataset="d", out="o", overrides=("training.epochs=2",))
    cmd = torchrun_command(worker_program(spec), nproc_per_node=2)
    assert cmd[:4] == [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    assert "--standalone" in cmd
    assert cmd[-4:-1] == ["-m", "ctrctl.training.worker", "--spec"]
    assert TrainSpec.from_json(cmd[-1]) == spec


def test_several_nodes_meet_at_the_endpoint() -> None:
    cmd = torchrun_command(worker_program(TrainSpec(dataset="d", out="o")), 4, nnodes=2, node_rank=1,
                           rdzv_endpoint="10.0.0.1:29400", rdzv_id="job7")
    assert "--standalone" not in cmd
    for flag in ("--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=10.0.0.1:29400", "--rdzv-id=job7"):
        assert flag in cmd


@pytest.mark.parametrize("kwargs, match", [
    ({"nnodes": 2}, "rdzv-endpoint"),
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "node-rank"),
    ({"nproc_per_node": 0}, "at least 1"),
])
def test_bad_launch_settings(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    args = {"nproc_per_node": 2, **kwargs}
    with pytest.raises(ConfigError, match=match):
        torchrun_command(worker_program(TrainSpec(dataset="d", out="o")), **args)
