"""Run one function on several local processes over gloo (or NCCL): tests and calibration.

Each rank gets a fresh process (``spawn``), ``MASTER_ADDR``/``MASTER_PORT`` on a free port,
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` in its environment and an
initialised default process group with a timeout. The function's return value on each rank
comes back to the caller; an exception on any rank fails the call, naming the rank. (Training
and evaluation processes come from torchrun instead; this is for a function, not a command.)

Example:
    >>> def body(rank: int, world_size: int, value: int) -> int:
    ...     t = torch.tensor([value + rank]); dist.all_reduce(t); return int(t)
    >>> run_multiprocess(body, world_size=2, args=(1,))   # [3, 3]
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ctrctl.errors import DistributedError


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(
    rank: int,
    world_size: int,
    local_world_size: int,
    port: int,
    backend: str,
    timeout_s: float,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    results: Any,
) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank % local_world_size),
        LOCAL_WORLD_SIZE=str(local_world_size),
    )
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
        value = fn(rank, world_size, *args, **kwargs)
        results[rank] = ("ok", value)
    except BaseException as exc:  # report everything, then fail this process
        results[rank] = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        raise SystemExit(1) from exc
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_multiprocess(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    backend: str = "gloo",
    local_world_size: int | None = None,
    timeout_s: float = 60.0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes.

    ``fn`` must be importable by the spawned processes (defined at module level in the
    package, or in a test module).

    Returns:
        The return value of each rank, in rank order.

    Raises:
        DistributedError: when a rank raised or exited non-zero, with that rank's traceback.
    """
    import torch.multiprocessing as mp

    manager = mp.Manager()
    results = manager.dict()
    context = mp.spawn(
        _worker,
        args=(world_size, local_world_size or world_size, free_port(), backend, timeout_s,
              fn, args, kwargs or {}, results),
        nprocs=world_size,
        join=False,
    )
    try:
        while not context.join():
            pass
    except Exception as exc:
        failures = [f"rank {r}: {v[1]}" for r, v in sorted(results.items()) if v[0] == "error"]
        raise DistributedError("\n".join(failures) or str(exc)) from exc
    out = []
    for rank in range(world_size):
        status, value = results.get(rank, ("error", "no result"))
        if status != "ok":
            raise DistributedError(f"rank {rank}: {value}")
        out.append(value)
    manager.shutdown()
    return out
