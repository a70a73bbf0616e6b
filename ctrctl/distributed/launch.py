"""Starting processes through torchrun, and joining their process group: the one place.

Nothing home-made launches processes: :func:`launch` runs ``python -m torch.distributed.run``
(torchrun), which starts the ranks, sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``PORT`` and fails them all when one fails. Each rank then calls
:func:`init_process_group`: gloo on CPU, NCCL on CUDA, always with a timeout, so a failed rank
cannot hang the others. ``ctrctl train`` (``ctrctl.training.launch``) and ``ctrctl eval``
(``ctrctl.evaluation.launch``) start their workers through here.

Example:
    >>> code = launch(["-m", "ctrctl", "eval", "--out", "eval", ...], nproc_per_node=2)
    >>> # in each rank:
    >>> init_process_group("auto")            # True: joined a group of WORLD_SIZE > 1
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta

from ctrctl.errors import ConfigError, DistributedError

__all__ = ["DEFAULT_TIMEOUT_S", "init_process_group", "launch", "needs_launch",
           "torchrun_command"]

logger = logging.getLogger(__name__)

#: Seconds a collective waits before failing (``CTRCTL_DIST_TIMEOUT_S`` overrides it).
DEFAULT_TIMEOUT_S = 300.0


def needs_launch(nproc_per_node: int, nnodes: int = 1) -> bool:
    """True when more processes are wanted and this is not already one of them."""
    return nproc_per_node * nnodes > 1 and "WORLD_SIZE" not in os.environ


def torchrun_command(
    program: Sequence[str],
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
) -> list[str]:
    """The torchrun command line that runs ``program`` on the processes of one node.

    Args:
        program: what each rank runs, as torchrun takes it (``["-m", "module", *args]``).
        nproc_per_node: processes on this node.
        nnodes: nodes taking part; more than one needs ``rdzv_endpoint``.
        node_rank: this node's index.
        rdzv_endpoint: ``HOST:PORT`` every node meets at.
        rdzv_id: the rendezvous name (the same on every node of one job).

    Raises:
        ConfigError: on counts below 1, a node rank out of range, or several nodes with no
            endpoint.
    """
    if nproc_per_node < 1 or nnodes < 1:
        raise ConfigError("--nproc-per-node and --nnodes must be at least 1")
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank} is outside 0..{nnodes - 1}")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ConfigError("running on several nodes needs --rdzv-endpoint HOST:PORT",
                              hint="the same endpoint on every node, reachable from each")
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id or 'ctrctl'}"]
    return [*cmd, "--max-restarts=0", *program]


def launch(
    program: Sequence[str],
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run ``program`` on this node's processes through torchrun and wait for them.

    Args:
        program: what each rank runs (``["-m", "module", *args]``).
        nproc_per_node, nnodes, node_rank, rdzv_endpoint: as :func:`torchrun_command`.
        env: variables added to this process's environment for the ranks.

    Returns:
        torchrun's exit code (0 when every rank succeeded).
    """
    cmd = torchrun_command(program, nproc_per_node, nnodes, node_rank, rdzv_endpoint,
                           rdzv_id=os.environ.get("CTRCTL_RDZV_ID", "ctrctl"))
    logger.info("starting %d process(es): %s", nproc_per_node * nnodes, " ".join(cmd))
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, check=False).returncode


def init_process_group(device: str = "auto", timeout_s: float | None = None) -> bool:
    """Join the default process group from torchrun's environment.

    NCCL when the ranks run on CUDA (``device`` ``cuda``, or ``auto`` with CUDA present), gloo
    otherwise; every collective times out after ``timeout_s`` (default
    ``CTRCTL_DIST_TIMEOUT_S`` or :data:`DEFAULT_TIMEOUT_S`).

    Returns:
        True when this process is one rank of several (the group is open), False when it runs
        alone (no ``WORLD_SIZE`` above 1: nothing is opened).

    Raises:
        DistributedError: when the group cannot be formed, naming the rank.
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = timeout_s or float(os.environ.get("CTRCTL_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    try:
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                timeout=timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - reported with the rank
        raise DistributedError(f"could not join the process group: {exc}",
                               where=f"rank {os.environ.get('RANK', '?')}",
                               hint="check MASTER_ADDR/PORT (torchrun sets them) and that "
                                    "every rank started") from exc
    return True
