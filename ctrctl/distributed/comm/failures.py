"""Failures that name a rank: a collective's error says which rank(s) were at fault.

A rank that fails on its own writes its rank and message to the rendezvous store
(:func:`fail_fast`, :func:`mark_failed`); survivors of a failed collective take a roll call
(:func:`diagnose`) and report *that* rank rather than a bare timeout."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from ctrctl.errors import CtrctlError, DistributedError

logger = logging.getLogger(__name__)

#: How long survivors of a failed collective wait for each other to learn who is missing.
ROLL_CALL_S = 10.0
_FAILED_KEY = "ctrctl/failed/"
_ALIVE_KEY = "ctrctl/alive/"


# ---- failures --------------------------------------------------------------------------------
def _store() -> Any | None:
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:  # no default group, or a torch without the helper
        return None


def mark_failed(message: str, rank: int | None = None) -> None:
    """Record in the rendezvous store that this rank failed, so that others can name it."""
    store = _store()
    if store is None:
        return
    rank = dist.get_rank() if rank is None else rank
    try:
        store.set(f"{_FAILED_KEY}{rank}", message[:500])
    except Exception:  # the store may be gone too; nothing more to do
        logger.debug("could not record the failure of rank %d", rank)


def failed_ranks() -> dict[int, str]:
    """Ranks that recorded a failure with :func:`mark_failed`, and their messages."""
    store = _store()
    if store is None or not dist.is_initialized():
        return {}
    found = {}
    for rank in range(dist.get_world_size()):
        key = f"{_FAILED_KEY}{rank}"
        try:
            if store.check([key]):
                found[rank] = store.get(key).decode(errors="replace")
        except Exception:
            break
    return found


def _roll_call(wait_s: float) -> tuple[list[int] | None, str]:
    """Survivors mark themselves alive and wait briefly for each other; who is missing?

    Returns (missing ranks or None when the store is unreachable, a note).
    """
    store = _store()
    if store is None:
        return None, "no rendezvous store to ask"
    world, me = dist.get_world_size(), dist.get_rank()
    try:
        store.set(f"{_ALIVE_KEY}{me}", "1")
        deadline = time.monotonic() + wait_s
        while True:
            missing = [r for r in range(world) if not store.check([f"{_ALIVE_KEY}{r}"])]
            if not missing or time.monotonic() > deadline:
                return missing, ""
            time.sleep(0.05)
    except Exception as exc:  # the store lives in one process (rank 0 or torchrun's agent)
        return None, f"the rendezvous store is unreachable ({type(exc).__name__}); " \
                     "rank 0 or the launcher hosting it has probably died"


def diagnose(exc: BaseException, what: str) -> DistributedError:
    """Turn a failed collective into a :class:`DistributedError` naming the rank(s) at fault."""
    if isinstance(exc, DistributedError):
        return exc
    me = dist.get_rank() if dist.is_initialized() else -1
    reported = failed_ranks()
    if reported:
        who = "; ".join(f"rank {r} failed: {m}" for r, m in sorted(reported.items()))
        return DistributedError(f"{what} stopped because another rank failed ({who})",
                                where=f"rank {me}",
                                hint="fix the failing rank; the others stopped with it")
    missing, note = _roll_call(ROLL_CALL_S)
    reported = failed_ranks()  # a rank may have written its reason during the roll call
    if reported:
        who = "; ".join(f"rank {r} failed: {m}" for r, m in sorted(reported.items()))
        return DistributedError(f"{what} stopped because another rank failed ({who})",
                                where=f"rank {me}")
    if missing:
        ranks = ", ".join(str(r) for r in missing)
        return DistributedError(
            f"{what} failed: rank(s) {ranks} did not arrive (killed, crashed or hung) "
            f"[{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}]",
            where=f"rank {me}",
            hint="look at the log of the rank(s) named; the others stopped instead of hanging")
    detail = note or "every rank is alive; the collective itself failed"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DistributedError(f"{what} failed: {first} ({detail})", where=f"rank {me}")


@contextlib.contextmanager
def collective(what: str) -> Iterator[None]:
    """Run collectives; a failure becomes a :class:`DistributedError` naming the rank at fault."""
    try:
        yield
    except DistributedError:
        raise
    except (RuntimeError, OSError, ValueError) as exc:
        # gloo reports timeouts and closed peers as RuntimeError (DistBackendError in newer
        # torch, a subclass): anything else raised here is a bug and passes through.
        if not dist.is_initialized():
            raise
        raise diagnose(exc, what) from exc


@contextlib.contextmanager
def rank_guard(what: str = "training step") -> Iterator[None]:
    """:func:`fail_fast` around :func:`collective`: the guard for a whole training step.

    A collective that fails because another rank died becomes a DistributedError naming that
    rank (and is not blamed on this one); any other exception is recorded for the others.

    Example:
        >>> with rank_guard():
        ...     loss = loss_fn(dmp(dense, kjt), labels); loss.backward(); opt.step()
    """
    with fail_fast(), collective(what):
        yield


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """Wrap a rank's work: an exception raised here is written to the store before it leaves.

    The other ranks, stuck in (or failing) their next collective, then name this rank and its
    error instead of reporting a bare timeout. Failures that came from other ranks
    (:class:`DistributedError`) are not recorded again.

    Example:
        >>> with fail_fast():
        ...     train_one_epoch(model, batches)
    """
    try:
        yield
    except DistributedError:
        raise
    except BaseException as exc:
        if dist.is_initialized():
            text = exc.render() if isinstance(exc, CtrctlError) else f"{type(exc).__name__}: {exc}"
            mark_failed(text)
        raise
