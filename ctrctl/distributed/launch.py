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

import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ctrctl.errors import ConfigError, CtrctlError, DistributedError
from ctrctl.io import write_json_atomic

__all__ = ["DEFAULT_TIMEOUT_S", "ERROR_DIR_ENV", "LAUNCHER_PID_ENV", "die_with_launcher",
           "init_process_group", "launch", "needs_launch", "report_worker_error",
           "torchrun_command"]

logger = logging.getLogger(__name__)

#: Where each rank records its one-line error for the launcher (set by :func:`launch`).
ERROR_DIR_ENV = "CTRCTL_ERROR_DIR"

#: The pid of the process that ran :func:`launch` (and holds the output's lock), for the
#: ranks: they die with it (:func:`die_with_launcher`).
LAUNCHER_PID_ENV = "CTRCTL_LAUNCHER_PID"

#: Seconds a collective waits before failing (``CTRCTL_DIST_TIMEOUT_S`` overrides it).
DEFAULT_TIMEOUT_S = 300.0
#: Seconds the nodes of a multi-node launch wait for each other (torchrun's own default);
#: ``CTRCTL_JOIN_TIMEOUT_S`` overrides it.
JOIN_TIMEOUT_ENV = "CTRCTL_JOIN_TIMEOUT_S"
DEFAULT_JOIN_TIMEOUT_S = 600.0


def join_timeout_s() -> float:
    """Seconds the nodes wait for each other: ``CTRCTL_JOIN_TIMEOUT_S`` or 600."""
    value = os.environ.get(JOIN_TIMEOUT_ENV, "")
    try:
        seconds = float(value) if value else DEFAULT_JOIN_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"{JOIN_TIMEOUT_ENV}={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ConfigError(f"{JOIN_TIMEOUT_ENV} must be positive, not {value}")
    return seconds


@dataclass(frozen=True)
class JoinWait:
    """What this node of a multi-node launch waits for: the other nodes at an endpoint."""

    endpoint: str
    nnodes: int
    node_rank: int
    timeout_s: float

    def announce(self) -> str:
        return (f"node {self.node_rank} of {self.nnodes}: waiting at {self.endpoint} for the "
                f"other node{'s' if self.nnodes > 2 else ''} to join (1 of {self.nnodes} "
                f"joined: this one), at most {self.timeout_s:.0f} s ({JOIN_TIMEOUT_ENV})")

    def timed_out(self, log: Path | None) -> DistributedError:
        others = [n for n in range(self.nnodes) if n != self.node_rank]
        missing = (f"node {others[0]}" if len(others) == 1
                   else f"one or more of nodes {', '.join(map(str, others))}")
        return DistributedError(
            f"{missing} never joined: {self.nnodes} nodes were expected at {self.endpoint} "
            f"and only this one (node {self.node_rank}) came within {self.timeout_s:.0f} s",
            where=f"node {self.node_rank}",
            hint=f"start the same command on the missing node with its --node-rank and "
                 f"--rdzv-endpoint {self.endpoint}, check that it can reach that address, "
                 f"or raise {JOIN_TIMEOUT_ENV}" + (f"; torchrun's log: {log}" if log else ""))


@dataclass(frozen=True)
class RankDeath:
    """The first rank torchrun saw fail, from its failure summary ("Root Cause")."""

    rank: int
    exitcode: int

    def describe(self) -> str:
        if self.exitcode < 0:
            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                name = "a signal"
            return (f"rank {self.rank} was killed by {name} (signal {-self.exitcode}) "
                    "without a ctrctl error: killed from outside or out of memory")
        return (f"rank {self.rank} exited with code {self.exitcode} without a ctrctl error: "
                "a crash or an internal error")


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*"
                      r"exitcode\s*:\s*(-?\d+)")


def rank_death(log_text: str) -> RankDeath | None:
    """The root-cause rank and its exit code in torchrun's failure summary (None: none)."""
    section = log_text.rsplit("Root Cause", 1)[-1]
    found = _FAILURE.search(section) or _FAILURE.search(log_text)
    return RankDeath(int(found.group(1)), int(found.group(2))) if found else None


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
                f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id or 'ctrctl'}",
                f"--rdzv-conf=join_timeout={join_timeout_s():g}"]
    return [*cmd, "--max-restarts=0", *program]


def worker_logging() -> int:
    """Set up a torchrun worker's logging and return its rank.

    Other libraries (FBGEMM logs every kernel's settings at INFO) stay at WARNING; ctrctl's
    own progress lines come from rank 0 only, on stdout, which the launcher shows as it comes
    (stderr, torchrun's noise, goes to a log).
    """
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout,
                        format=f"%(asctime)s rank{rank} %(levelname)s %(message)s")
    logging.getLogger("ctrctl").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    return rank


def run_rank(rank: int, body: Callable[[], object]) -> int:
    """Run a torchrun worker's ``body`` and close the process group after it: 0 when it
    returns, 1 for a ctrctl error (one line on stderr naming the rank, and the launcher's
    record of it); a bug's traceback goes to the ranks' log."""
    finished = False
    try:
        body()
        finished = True
        return 0
    except CtrctlError as exc:
        print(f"rank {rank}: error: {exc.render()}", file=sys.stderr)
        report_worker_error(exc.render(), type(exc).__name__)
        return 1
    except Exception as exc:
        report_worker_error(f"internal error: {type(exc).__name__}: {exc}", "InternalError")
        raise
    finally:
        close_process_group(synchronize=finished)


def report_worker_error(message: str, kind: str = "CtrctlError") -> None:
    """In a rank started by :func:`launch`: record this rank's error as one line.

    The launcher reads these records when a rank fails and reports the first cause, rank
    named, instead of torchrun's traceback. Outside a launch it does nothing.
    """
    folder = os.environ.get(ERROR_DIR_ENV)
    if not folder:
        return
    rank = int(os.environ.get("RANK", "0"))
    write_json_atomic(Path(folder) / f"rank-{rank}.json",
                      {"rank": rank, "message": message, "kind": kind})


def worker_failure(folder: Path, code: int, log: Path | None,
                   join: JoinWait | None = None) -> DistributedError:
    """One error for a failed launch: the first rank's own cause, the others counted.

    A rank that failed because a peer died (a DistributedError: a closed connection, a
    timeout) is a consequence, so a rank with another error is named first. A rank that
    died without a word (``kill -9``, a crash) is named from torchrun's failure summary in
    ``log``, with its signal or exit code; a node that never joined ``join`` is named.
    """
    text = ""
    if log is not None:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            text = ""
    if join is not None and "RendezvousTimeoutError" in text:
        return join.timed_out(log)
    records: list[dict[str, Any]] = []
    for path in sorted(folder.glob("rank-*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    records.sort(key=lambda r: (r.get("kind") == "DistributedError", int(r.get("rank", 0))))
    where = f"the log of every rank: {log}" if log else None
    hint = (f"{where}, or rerun with --verbose" if where
            else "rerun with --verbose to see every rank's output")
    death = rank_death(text)
    silent = death is not None and all(int(r.get("rank", -1)) != death.rank for r in records)
    if death is not None and (silent or not records):
        after = len(records)
        tail = f" ({after} other rank{'s' if after > 1 else ''} failed after it)" if after else ""
        return DistributedError(f"{death.describe()}{tail}", where=f"rank {death.rank}",
                                hint=hint)
    if not records:
        return DistributedError(f"a rank failed (torchrun exit code {code}) without a ctrctl "
                                "error: a crash or an internal error", hint=hint)
    first = records[0]
    others = len(records) - 1
    tail = f" ({others} other rank{'s' if others > 1 else ''} failed after it)" if others else ""
    return DistributedError(f"{first['message']}{tail}", where=f"rank {first['rank']}",
                            hint=hint)


# ---- process lifetime: the launcher, torchrun's agent and the ranks die together ------------
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _kill_me_with_parent() -> bool:
    """Ask Linux to SIGKILL this process when its parent (thread) ends; False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (from /proc), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces


def die_with_launcher() -> None:
    """In a rank that :func:`launch` started: die as soon as torchrun's agent dies.

    torchrun starts the ranks in sessions of their own, so a ``kill -9`` of the launcher's
    process group or of the agent left them training on, writing the output whose lock
    had died with the launcher. Each rank asks the kernel for SIGKILL when its parent (the
    agent) ends, and the agent gets the same with the launcher as parent
    (:func:`launch`): the work lives exactly as long as the process holding the lock. A
    parent that died before the request is caught by looking again: the agent's parent
    must still be the launcher. Outside a launch, or off Linux, it does nothing.
    """
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or not _kill_me_with_parent():
        return
    agent = os.getppid()
    if agent != int(launcher) and _parent_of(agent) != int(launcher):
        os.kill(os.getpid(), signal.SIGKILL)  # orphaned before the request took effect


def _agent_dies_with(launcher: int) -> Callable[[], None]:
    """``preexec_fn`` for torchrun's agent: SIGKILL when the launcher ends."""
    def setup() -> None:
        if _kill_me_with_parent() and os.getppid() != launcher:
            os._exit(1)
    return setup


def launch(
    program: Sequence[str],
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run ``program`` on this node's processes through torchrun and wait for them.

    The ranks' standard output (their progress and log lines) is shown as it comes;
    torchrun's own messages and the ranks' standard error go to a log file, and a failure is
    one :class:`DistributedError` naming the rank and its cause (:func:`worker_failure`).
    With ``ctrctl --verbose`` (DEBUG logging) everything is shown as it comes.

    Args:
        program: what each rank runs (``["-m", "module", *args]``).
        nproc_per_node, nnodes, node_rank, rdzv_endpoint: as :func:`torchrun_command`.
        env: variables added to this process's environment for the ranks.

    Returns:
        0: every rank succeeded.

    Raises:
        DistributedError: a rank failed.
    """
    cmd = torchrun_command(program, nproc_per_node, nnodes, node_rank, rdzv_endpoint,
                           rdzv_id=os.environ.get("CTRCTL_RDZV_ID", "ctrctl"))
    logger.info("starting %d process(es): %s", nproc_per_node * nnodes, " ".join(cmd))
    join = JoinWait(rdzv_endpoint, nnodes, node_rank, join_timeout_s()) \
        if nnodes > 1 and rdzv_endpoint is not None else None
    if join is not None:
        logger.info("%s", join.announce())
    verbose = logging.getLogger("ctrctl").isEnabledFor(logging.DEBUG)
    with tempfile.TemporaryDirectory(prefix="ctrctl-ranks-") as errors:
        ranks_env = {**os.environ, **(env or {}), ERROR_DIR_ENV: errors,
                     LAUNCHER_PID_ENV: str(os.getpid())}
        agent = _agent_dies_with(os.getpid())
        if verbose:
            code = subprocess.run(cmd, env=ranks_env, check=False, preexec_fn=agent).returncode
            log = None
        else:
            fd, name = tempfile.mkstemp(prefix="ctrctl-ranks-", suffix=".log")
            log = Path(name)
            with os.fdopen(fd, "w") as handle:
                code = subprocess.run(cmd, env=ranks_env, stderr=handle, check=False,
                                      preexec_fn=agent).returncode
        if code == 0:
            if log is not None:
                log.unlink(missing_ok=True)
            return 0
        raise worker_failure(Path(errors), code, log, join)


def init_process_group(device: str = "auto", timeout_s: float | None = None) -> bool:
    """Join the default process group from torchrun's environment.

    NCCL when the ranks run on CUDA (``device`` ``cuda``, or ``auto`` with CUDA present), gloo
    otherwise; every collective times out after ``timeout_s`` (default
    ``CTRCTL_DIST_TIMEOUT_S`` or :data:`DEFAULT_TIMEOUT_S`).

    Returns:
        True when this process is one rank of several (the group is open), False when it runs
        alone (no ``WORLD_SIZE`` above 1: nothing is opened).

    The group itself is opened by :func:`ctrctl.distributed.comm.init_process_group` (the
    one call of ``torch.distributed.init_process_group``); this function is the policy of a
    torchrun worker around it.

    Raises:
        DistributedError: when the group cannot be formed, naming the rank.
    """
    die_with_launcher()
    import torch
    import torch.distributed as dist

    from ctrctl.distributed.comm import groups

    if dist.is_initialized():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = timeout_s or float(os.environ.get("CTRCTL_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    try:
        groups.init_process_group("nccl" if use_cuda else "gloo",
                                  timeout=timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - reported with the rank
        raise DistributedError(f"could not join the process group: {exc}",
                               where=f"rank {os.environ.get('RANK', '?')}",
                               hint="check MASTER_ADDR/PORT (torchrun sets them) and that "
                                    "every rank started") from exc
    return True


def close_process_group(*, synchronize: bool = True) -> None:
    """Leave the default process group so that the process can exit cleanly.

    gloo's worker threads drop each finished collective after its caller has moved on. When
    Python no longer holds the collective's tensors, that drop takes the GIL; if the
    interpreter is already finalizing, the thread is ended inside the destructor and the
    process aborts ("terminate called without an active exception", SIGABRT) after a run
    that succeeded. That happened in 1 of 5 two-rank runs of a small model on a fast CPU.

    So, in this order:
      1. a barrier (``synchronize``), so every rank's collectives are done, and the GIL is
         free while it waits;
      2. the group is destroyed;
      3. a collection, so the group's last references go and its threads are joined now
         (torch releases the GIL for that), not during finalization.

    Pass ``synchronize=False`` on an error path, where a peer may never reach the barrier.
    """
    import gc

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    try:
        if synchronize:
            dist.barrier()
    finally:
        dist.destroy_process_group()
        gc.collect()
