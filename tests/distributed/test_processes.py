"""The multi-process harness reports a rank that dies of a signal with how and when, and
the end of that rank's own stderr (Python's fault handler stacks included); a rank dying
after every rank returned its result costs a warning, not the results."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.distributed as dist

from ctrctl.distributed.launch import close_process_group
from ctrctl.distributed.processes import run_multiprocess
from ctrctl.errors import DistributedError

pytestmark = pytest.mark.distributed


def abort_on_rank_one(rank: int, world_size: int) -> int:
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        print("rank one about to abort", file=sys.stderr, flush=True)
        os.abort()
    return rank


def test_a_rank_killed_by_a_signal_is_named_with_its_stderr() -> None:
    with pytest.raises(DistributedError) as info:
        run_multiprocess(abort_on_rank_one, 2, timeout_s=30)
    message = str(info.value)
    assert "process 1 terminated with signal SIGABRT, before returning a result" in message
    assert "rank one about to abort" in message                  # its own stderr
    assert "in abort_on_rank_one" in message                     # the fault handler's stack


def test_every_rank_returns_through_the_closing_barrier() -> None:
    assert run_multiprocess(all_reduce_rank, 3) == [3.0] * 3


def all_reduce_rank(rank: int, world_size: int) -> float:
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return float(t)


def abort_while_closing_on_rank_one(rank: int, world_size: int) -> int:
    dist.all_reduce(torch.ones(1))
    if rank == 1:  # returns its result, then dies tearing the process group down
        dist.destroy_process_group = os.abort  # type: ignore[assignment]
    return rank


def test_a_rank_dying_after_every_result_warns_and_keeps_the_results() -> None:
    with pytest.warns(RuntimeWarning, match="SIGABRT, after returning its result"):
        assert run_multiprocess(abort_while_closing_on_rank_one, 2, timeout_s=30) == [0, 1]


def threads_after_closing(rank: int, world_size: int, cycled_group: bool) -> int:
    """This process's threads once close_process_group returned, after a collective on the
    default group and, with ``cycled_group``, one on a second group that only a garbage
    collection frees (as a model holding its group in a reference cycle does)."""
    if cycled_group:
        holder: dict[str, object] = {"group": dist.new_group()}
        holder["self"] = holder
        dist.all_gather_object([None] * world_size, rank, group=holder["group"])
        del holder
    dist.all_gather_object([None] * world_size, rank)
    close_process_group()
    assert not dist.is_initialized()
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_closing_the_group_joins_every_group_thread_before_exit() -> None:
    """A group still alive when the interpreter finalizes can abort the process (its gloo
    threads drop finished collectives under the GIL): closing leaves none behind."""
    alone = run_multiprocess(threads_after_closing, 2, args=(False,))
    assert run_multiprocess(threads_after_closing, 2, args=(True,)) == alone

