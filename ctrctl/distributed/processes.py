"""Run one function on several local processes over gloo (or NCCL): tests and calibration.

Each rank gets a fresh process (``spawn``), ``MASTER_ADDR``/``MASTER_PORT`` on a free port,
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` in its environment and an
initialised default process group with a timeout. The function's return value on each rank
comes back to the caller; an exception on any rank fails the call, naming the rank. (Training
and evaluation processes come from torchrun instead; this is for a function, not a command.)

When a rank dies instead of raising (a signal: an abort in a C++ library, a crash), the error
says whether it had returned its result already (it died tearing down), and carries the end
of that rank's stderr, where Python's fault handler has written every thread's stack. Each
rank's stderr goes to a file for that; it is shown only when the call fails. Ranks that
returned wait for each other before the process group is torn down, so none closes its
connections while a peer still finishes its last collective; a rank that dies after every
rank has returned its result (closing down) costs a RuntimeWarning with that report, not the
results.

Example:
    >>> def body(rank: int, world_size: int, value: int) -> int:
    ...     t = torch.tensor([value + rank]); dist.all_reduce(t); return int(t)
    >>> run_multiprocess(body, world_size=2, args=(1,))   # [3, 3]
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ctrctl.distributed.launch import close_process_group
from ctrctl.errors import DistributedError

#: How much of a failed rank's stderr the error carries (its end).
STDERR_TAIL_CHARS = 6000


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
    stderr_dir: str,
) -> None:
    import faulthandler

    # This rank's stderr (warnings, C++ messages, the fault handler's stacks) into its file.
    log = open(os.path.join(stderr_dir, f"rank{rank}.txt"), "w", buffering=1)  # noqa: SIM115
    sys.stderr.flush()
    os.dup2(log.fileno(), 2)
    faulthandler.enable(file=log, all_threads=True)

    import torch

    from ctrctl.distributed.comm.groups import init_process_group

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
        # rank and world size from the environment set above
        init_process_group(backend, timeout=timedelta(seconds=timeout_s))
        value = fn(rank, world_size, *args, **kwargs)
        results[rank] = ("ok", value)
    except BaseException as exc:  # report everything, then fail this process
        results[rank] = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        close_process_group(synchronize=False)  # a peer may never reach a barrier
        raise SystemExit(1) from exc
    # Every rank has finished its collectives before any closes its connections.
    close_process_group()


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
    with tempfile.TemporaryDirectory(prefix="ctrctl-ranks-") as stderr_dir:
        context = mp.spawn(
            _worker,
            args=(world_size, local_world_size or world_size, free_port(), backend, timeout_s,
                  fn, args, kwargs or {}, results, stderr_dir),
            nprocs=world_size,
            join=False,
        )
        try:
            while not context.join():
                pass
        except Exception as exc:
            reported = dict(results.items())
            manager.shutdown()
            report = _failure_report(exc, reported, stderr_dir, world_size)
            if len(reported) == world_size and all(v[0] == "ok" for v in reported.values()):
                # Every rank returned its result, then one died closing down: the results
                # are whole. Said, not hidden.
                warnings.warn(f"a rank died after returning its result: {report}",
                              RuntimeWarning, stacklevel=2)
                return [reported[r][1] for r in range(world_size)]
            raise DistributedError(report) from exc
        out = []
        for rank in range(world_size):
            status, value = results.get(rank, ("error", "no result"))
            if status != "ok":
                raise DistributedError(f"rank {rank}: {value}")
            out.append(value)
    manager.shutdown()
    return out


def _failure_report(exc: Exception, reported: dict[int, tuple[str, Any]], stderr_dir: str,
                    world_size: int) -> str:
    """What went wrong on which rank: each rank's exception; for a rank that died of a
    signal, which and when (before or after returning its result); the end of the stderr of
    each rank that failed."""
    lines = [f"rank {r}: {v[1]}" for r, v in sorted(reported.items()) if v[0] == "error"]
    dead = getattr(exc, "error_index", None)
    if getattr(exc, "signal_name", None) or not lines:
        returned = dead is not None and reported.get(dead, ("",))[0] == "ok"
        when = ("after returning its result (waiting for the other ranks or tearing down the "
                "process group)" if returned else "before returning a result")
        lines.append(f"{exc}, {when}")
    for rank in range(world_size):
        if rank == dead or reported.get(rank, ("",))[0] == "error":
            tail = _tail(os.path.join(stderr_dir, f"rank{rank}.txt"))
            if tail:
                lines.append(f"--- the end of rank {rank}'s stderr ---\n{tail}")
    return "\n".join(lines)


def _tail(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text[-STDERR_TAIL_CHARS:].strip()
