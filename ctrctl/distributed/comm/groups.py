"""Process groups: the backend for a device, the one start of the default group, and new
groups that inherit its timeout (every group ctrctl makes has one)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ctrctl.errors import DistributedError

logger = logging.getLogger(__name__)

#: Default timeout of every process group ctrctl creates.
DEFAULT_TIMEOUT = timedelta(seconds=300)

ProcessGroup = Any  # torch.distributed.ProcessGroup; Any keeps mypy quiet across versions


# ---- process groups --------------------------------------------------------------------------
def default_backend(device: torch.device | str | None = None) -> str:
    """``nccl`` for a CUDA device, ``gloo`` otherwise."""
    kind = torch.device(device).type if device is not None else "cpu"
    return "nccl" if kind == "cuda" else "gloo"


def init_process_group(
    backend: str | None = None,
    timeout: timedelta = DEFAULT_TIMEOUT,
    device: torch.device | str | None = None,
) -> ProcessGroup:
    """Initialise the default process group from torchrun's environment, with a timeout:
    the one place ctrctl opens it (a torchrun worker goes through
    :func:`ctrctl.distributed.launch.init_process_group`, which decides backend and timeout).

    Args:
        backend: ``gloo`` or ``nccl``; default from ``device``.
        timeout: every collective on the group fails after this long instead of hanging.
        device: the device this rank computes on.

    Returns:
        The default process group (already initialised groups are returned as they are).

    Example:
        >>> pg = init_process_group(timeout=timedelta(seconds=60))
    """
    if dist.is_initialized():
        return dist.group.WORLD
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            raise DistributedError(
                f"environment variable {name} is not set",
                where="init_process_group",
                hint="start the ranks with torchrun (ctrctl train --nproc-per-node N)",
            )
    dist.init_process_group(backend or default_backend(device), timeout=timeout)
    return dist.group.WORLD


def group_timeout(group: ProcessGroup | None = None) -> timedelta:
    """The timeout ``group`` (default: the world) was created with.

    Falls back to :data:`DEFAULT_TIMEOUT` where the backend does not say.
    """
    pg: Any = group if group is not None else dist.group.WORLD
    for device in getattr(pg, "_device_types", None) or [torch.device("cpu")]:
        try:
            timeout = pg._get_backend(device).options._timeout
        except (AttributeError, RuntimeError):
            continue
        if isinstance(timeout, timedelta):
            return timeout
    return DEFAULT_TIMEOUT


def new_group(ranks: Sequence[int], timeout: timedelta | None = None,
              parent: ProcessGroup | None = None) -> ProcessGroup:
    """A sub-group (e.g. the ranks of one host) with a timeout. Every rank must call it.

    Args:
        ranks: global ranks of the members.
        timeout: how long its collectives wait; default: the timeout of ``parent``.
        parent: the group it is carved from (default: the world).

    Example:
        >>> host = new_group([0, 1], parent=pg)      # waits as long as pg does
    """
    return dist.new_group(list(ranks), timeout=timeout or group_timeout(parent))
