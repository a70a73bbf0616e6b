"""The pieces train pipelines are made of: loading ahead on a thread, and primed forwards.

* :class:`LoadAhead` is stage 1: a thread takes batches from the loader and moves them to the
  device (on CUDA from pinned memory on a side stream, the copy waited by the consuming
  stream), ``depth`` batches ahead of the loop.
* :class:`PrimedForward` stands in for an embedding collection's ``forward``: the pipeline
  primes it with what it prepared for a batch (its input distribution in flight, or its pooled
  embeddings); when the model then calls the collection with that batch's features, the
  prepared work is finished instead of started. Any other call (validation, a batch the
  pipeline did not see) runs the collection's own forward.
* :func:`all_have_batch` is the one tiny collective per step by which ranks agree that each
  still has a batch, so ranks with uneven data stop together instead of hanging.

Example:
    >>> ahead = LoadAhead(iter(items), torch.device("cpu"), depth=2)
    >>> tag, batch = ahead.next()                     # None when the loader is exhausted
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from ctrctl.distributed.comm.groups import ProcessGroup
from ctrctl.distributed.pipeline.trace import Tracer
from ctrctl.distributed.pipeline.types import Batch, Item
from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor
from ctrctl.sparse.keyed_tensor import KeyedTensor

__all__ = ["LoadAhead", "PrimedForward", "all_have_batch", "batch_tensors"]

_DONE = object()


def batch_tensors(batch: Batch) -> list[torch.Tensor]:
    """Every tensor a batch holds (dense, labels and its KJT's), for stream bookkeeping."""
    out: list[torch.Tensor] = []
    for value in (getattr(batch, name, None) for name in ("dense", "labels", "sparse")):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, KeyedJaggedTensor):
            out += [t for t in (value.values(), value.lengths(), value.weights_or_none())
                    if t is not None]
    return out


class LoadAhead:
    """Stage 1: a thread reads ``(tag, batch)`` items and moves each batch to ``device``.

    Args:
        source: the items (the loop's batches with their loader positions).
        device: where batches go.
        depth: items kept ready ahead of the consumer (2: batch i+2 loads while i trains
            and i+1 is being distributed).
        tracer: records each item's ``load`` span on the thread's track.

    :meth:`next` returns the next item, or None once the source is exhausted; an exception
    raised while loading is raised there. :meth:`close` stops the thread (items read ahead
    are dropped: the loop's saved position is that of the last batch it trained on).
    """

    def __init__(self, source: Iterator[Item], device: torch.device, depth: int = 2,
                 tracer: Tracer | None = None) -> None:
        self.device = device
        self._source = source
        self._ready: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._tracer = tracer or Tracer(enabled=False)
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._exhausted = False
        self._thread = threading.Thread(target=self._run, name="ctrctl-load-ahead",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            n = 0
            while not self._stop.is_set():
                with self._tracer.span("load", n):
                    item: object = next(self._source, _DONE)
                    if item is not _DONE:
                        item = self._to_device(cast(Item, item))
                if not self._put(item) or item is _DONE:
                    return
                n += 1
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def _to_device(self, item: Item) -> tuple[Any, ...]:
        tag, batch = item
        if self._stream is None:
            return tag, batch.to(self.device)
        with torch.cuda.stream(self._stream):
            moved = batch.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return tag, moved, event

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> Item | None:
        """The next ``(tag, batch)`` on the device, or None when the source is exhausted."""
        if self._exhausted:
            return None
        item = self._ready.get()
        if item is _DONE:
            self._exhausted = True
            return None
        if isinstance(item, BaseException):
            self._exhausted = True
            raise item
        if self._stream is None:
            return item
        tag, batch, event = item
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for t in batch_tensors(batch):  # made on the side stream, used on this one
            t.record_stream(current)
        return tag, batch

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._ready.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=0.05)


class PrimedForward:
    """An embedding collection's forward that first looks for work primed for its input.

    Installed as the module's ``forward`` (the instance attribute shadows the class's) by
    :meth:`install`, removed by :meth:`remove`. ``prime(features, finish)``: the next call
    with this very KJT object returns ``finish()``. Calls with other features run the
    module's own forward.

    Attributes:
        last: the output of the latest call (the pipeline hooks its gradient).
        primed_calls, own_calls: how many calls took primed work, and ran the forward.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.original: Callable[..., KeyedTensor] = module.forward
        self._primed: deque[tuple[KeyedJaggedTensor, Callable[[], KeyedTensor]]] = deque()
        self.last: KeyedTensor | None = None
        self.primed_calls = 0
        self.own_calls = 0

    @classmethod
    def install(cls, module: nn.Module) -> PrimedForward:
        primed = cls(module)
        module.forward = primed  # type: ignore[method-assign]
        return primed

    def remove(self) -> None:
        self._primed.clear()
        self.module.__dict__.pop("forward", None)

    def prime(self, features: KeyedJaggedTensor, finish: Callable[[], KeyedTensor]) -> None:
        self._primed.append((features, finish))

    def clear(self) -> None:
        self._primed.clear()

    def __call__(self, features: KeyedJaggedTensor, *args: Any, **kwargs: Any) -> KeyedTensor:
        if self._primed and self._primed[0][0] is features and not args and not kwargs:
            _, finish = self._primed.popleft()
            self.primed_calls += 1
            out = finish()
        else:
            self.own_calls += 1
            out = self.original(features, *args, **kwargs)
        self.last = out
        return out


def all_have_batch(have: bool, group: ProcessGroup | None = None) -> bool:
    """True when every rank of ``group`` has a batch (one int all-reduce; True alone)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return have
    flag = torch.tensor([1 if have else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
