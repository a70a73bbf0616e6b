"""Starting training processes: in this process, or N per node through torchrun.

``ctrctl train --nproc-per-node N`` runs ``python -m torch.distributed.run ... -m
ctrctl.training.worker --spec JSON``: torchrun starts the ranks, sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``, and fails them all when one fails.
Each worker opens the default process group with :func:`init_distributed` (gloo on CPU, NCCL
on CUDA, always with a timeout) and runs :func:`ctrctl.training.loop.train`.

Several nodes (``--nnodes M --node-rank R --rdzv-endpoint HOST:PORT`` on each) must give the
same ``--out``, on storage every node sees: rank 0 names each checkpoint folder and writes the
shared files (metrics.json, config.json), and every rank writes its table pieces there.

Example:
    >>> spec = TrainSpec(dataset="data", out="runs/a", config="pipelines/small.yaml")
    >>> launch(spec, nproc_per_node=2)        # returns the exit code of torchrun
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ctrctl.errors import ConfigError

__all__ = ["DEFAULT_TIMEOUT_S", "TrainSpec", "init_distributed", "launch", "torchrun_command"]

logger = logging.getLogger(__name__)

#: Seconds a collective waits before failing (``CTRCTL_DIST_TIMEOUT_S`` overrides it).
DEFAULT_TIMEOUT_S = 300.0


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


def init_distributed(device: str = "auto", timeout_s: float | None = None) -> str:
    """Open the default process group from torchrun's environment; returns the backend.

    NCCL when training on CUDA, gloo otherwise; every collective times out after
    ``timeout_s`` (default ``CTRCTL_DIST_TIMEOUT_S`` or 300 s) so a failed rank cannot hang
    the others forever.
    """
    if dist.is_initialized():
        return str(dist.get_backend())
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = timeout_s or float(os.environ.get("CTRCTL_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    return backend


def torchrun_command(
    spec: TrainSpec,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
) -> list[str]:
    """The torchrun command line that starts the workers of one node."""
    if nproc_per_node < 1 or nnodes < 1:
        raise ConfigError("--nproc-per-node and --nnodes must be at least 1")
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank} is outside 0..{nnodes - 1}")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ConfigError("training on several nodes needs --rdzv-endpoint HOST:PORT",
                              hint="the same endpoint on every node, reachable from each")
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id or 'ctrctl'}"]
    cmd += ["--max-restarts=0", "-m", "ctrctl.training.worker", "--spec", spec.to_json()]
    return cmd


def launch(
    spec: TrainSpec,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
) -> int:
    """Run the workers of this node through torchrun and wait; returns its exit code."""
    env = dict(os.environ)
    # One intra-op thread per rank unless told otherwise: ranks share the node's cores.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    env.update(spec.env)
    # Every node must name the same rendezvous: CTRCTL_RDZV_ID when several jobs share one.
    cmd = torchrun_command(spec, nproc_per_node, nnodes, node_rank, rdzv_endpoint,
                           rdzv_id=os.environ.get("CTRCTL_RDZV_ID", "ctrctl"))
    logger.info("starting %d worker(s): %s", nproc_per_node * nnodes, " ".join(cmd[:8]))
    return subprocess.run(cmd, env=env, check=False).returncode
