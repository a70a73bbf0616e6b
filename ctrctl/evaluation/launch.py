"""Running ``ctrctl eval`` on several processes: torchrun starts them, gloo/NCCL joins them.

``ctrctl eval --nproc-per-node N`` re-runs itself under ``python -m torch.distributed.run``
(nothing home-made launches processes); each child sees ``RANK``/``WORLD_SIZE`` and calls
:func:`init_from_env`, which joins the default process group with a timeout.

Example:
    >>> if needs_launch(nproc_per_node=2):
    ...     code = launch(["eval", "--checkpoint", "ckpt", ...], nproc_per_node=2)
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import timedelta

from ctrctl.errors import DistributedError

logger = logging.getLogger(__name__)

#: Set in the children so that the parent, not each rank, reports a failed gate.
CHILD_ENV = "CTRCTL_EVAL_CHILD"


def needs_launch(nproc_per_node: int) -> bool:
    """True when more processes are wanted and this is not already one of them."""
    return nproc_per_node > 1 and "WORLD_SIZE" not in os.environ


def launch(args: Sequence[str], nproc_per_node: int) -> int:
    """Run ``ctrctl <args>`` on ``nproc_per_node`` local processes; returns torchrun's exit code."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={nproc_per_node}", "-m", "ctrctl", *args,
    ]
    logger.info("launching %d processes: %s", nproc_per_node, " ".join(command))
    env = os.environ | {CHILD_ENV: "1"}
    return subprocess.run(command, env=env, check=False).returncode


def init_from_env(timeout_s: float = 600.0) -> bool:
    """Join the default process group when started by torchrun; True when distributed.

    Raises:
        DistributedError: when the group cannot be formed.
    """
    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if dist.is_initialized():
        return True
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - reported with the rank
        raise DistributedError(
            f"could not join the process group: {exc}",
            where=f"rank {os.environ.get('RANK', '?')}",
        ) from exc
    return True
