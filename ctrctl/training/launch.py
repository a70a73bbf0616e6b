"""Starting training processes: in this process, or N per node through torchrun.

``ctrctl train --nproc-per-node N`` runs ``python -m torch.distributed.run ... -m
ctrctl.training.worker --spec JSON`` through :func:`ctrctl.distributed.launch.launch`:
torchrun starts the ranks and fails them all when one fails. Each worker opens the default
process group with :func:`ctrctl.distributed.launch.init_process_group` (gloo on CPU, NCCL
on CUDA, always with a timeout) and runs :func:`ctrctl.training.loop.train`.

Several nodes (``--nnodes M --node-rank R --rdzv-endpoint HOST:PORT`` on each) must give the
same ``--out``, on storage every node sees: rank 0 names each checkpoint folder and writes the
shared files (metrics.json, config.json), and every rank writes its table pieces there.

Example:
    >>> spec = TrainSpec(dataset="data", out="runs/a", config="pipelines/small.yaml")
    >>> launch_training(spec, nproc_per_node=2)        # returns the exit code of torchrun
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

from ctrctl.distributed.launch import launch

__all__ = ["TrainSpec", "launch_training", "worker_program"]


@dataclass(frozen=True)
class TrainSpec:
    """Everything a worker needs to run ``train``: what the command line said."""

    dataset: str
    out: str
    config: str | None = None
    overrides: tuple[str, ...] = ()
    resume: bool = False
    overwrite: bool = False
    plan: str | None = None
    track: bool = True
    tracking_uri: str | None = None
    experiment: str = "ctrctl"
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrainSpec:
        data = json.loads(text)
        data["overrides"] = tuple(data.get("overrides", ()))
        return cls(**data)


def worker_program(spec: TrainSpec) -> list[str]:
    """What each training rank runs under torchrun: the worker module with the spec."""
    return ["-m", "ctrctl.training.worker", "--spec", spec.to_json()]


def launch_training(
    spec: TrainSpec,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
) -> int:
    """Run the training workers of this node through torchrun and wait; 0 when all succeed.

    Raises:
        DistributedError: a rank failed, naming it and its own cause.
    """
    env = dict(os.environ)
    # One intra-op thread per rank unless told otherwise: ranks share the node's cores.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    env.update(spec.env)
    return launch(worker_program(spec), nproc_per_node, nnodes, node_rank, rdzv_endpoint,
                  env=env)
