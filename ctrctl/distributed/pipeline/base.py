"""The train pipeline interface, and ``base``: the plain loop, one batch at a time.

A train pipeline owns the order of a step's stages: loading a batch, its input distribution
(the ids' all-to-all), forward, backward (the embedding tables update here, fused) and the
dense optimizer step. :meth:`TrainPipeline.progress` trains one step on the next batch of an
iterator of ``(tag, batch)`` items (the tag, e.g. the loader position after the batch, comes
back with the step's output, so the loop knows which batch it trained on even when the
pipeline has read ahead) and returns the loss as a tensor: reading its value is left to the
caller, every N steps, so no step waits on the device for it.

Pipelines (``ctrctl/distributed/pipeline/``, one file each):

==============  ======  ==================================================================
name            exact   what overlaps
==============  ======  ==================================================================
``base``        yes     nothing: load, distribute, forward, backward, step in turn
``sparse-dist`` yes     batch i+2 loads on a thread; batch i+1's ids travel during
                        backward(i) and the optimizer step
``prefetch``    yes     ``sparse-dist``, and batch i+1's rows come into cached tables'
                        DRAM caches during backward(i)
``semi-sync``   no      batch i+1's embedding lookup runs during batch i's dense backward,
                        on weights one step older
==============  ======  ==================================================================

Edges every pipeline keeps: each batch read is trained (the ones in flight when the data
ends are drained), ranks agree each step that all still have a batch (one tiny all-reduce),
so ranks with uneven data stop together instead of hanging, and :meth:`score` runs
validation through the same stages (forward only).

Example:
    >>> pipeline = make_pipeline("sparse-dist", model, optimizer, torch.device("cpu"))
    >>> items = iter(enumerate(loader))
    >>> while True:
    ...     try:
    ...         out = pipeline.progress(items)
    ...     except StopIteration:
    ...         break
    >>> pipeline.close()
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from ctrctl.distributed.comm.groups import ProcessGroup
from ctrctl.distributed.pipeline.stages import LoadAhead, PrimedForward, all_have_batch
from ctrctl.distributed.pipeline.trace import Tracer
from ctrctl.distributed.pipeline.types import Batch, Item, Tag
from ctrctl.modules.collision_collection import ManagedCollisionCollection

__all__ = ["BasePipeline", "StepOutput", "TrainPipeline"]


@dataclass
class StepOutput:
    """What one step of a pipeline did.

    Attributes:
        loss: the batch's mean loss, detached, a 0-dim tensor on the device (read it only
            when needed: on CUDA reading waits for the step).
        tag: the tag that came with the batch.
        rows: the batch's rows on this rank.
        step: the pipeline's step count after this one.
    """

    loss: torch.Tensor
    tag: Tag
    rows: int
    step: int


class TrainPipeline(abc.ABC):
    """Trains a model one step per :meth:`progress` call, with stages in its own order.

    Args:
        model: the model (``model(dense, sparse) -> logits``), wrapped
            (DistributedModelParallel) or not.
        optimizer: the dense optimizer (the tables' optimizer is fused into backward).
        device: where batches go.
        loss_fn: ``loss_fn(logits, labels)`` (default: BCE with logits, the mean).
        autocast: run forward under bf16 autocast.
        tracer: records each stage's span (for ``--trace``).
        group: the ranks that agree on having a batch (default: the world).
    """

    name: ClassVar[str] = ""
    #: Whether it trains with exactly the numerics of ``base``.
    exact: ClassVar[bool] = True
    #: Whether batches load on a thread ahead of the loop.
    loads_ahead: ClassVar[bool] = False

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 *, loss_fn: nn.Module | None = None, autocast: bool = False,
                 tracer: Tracer | None = None, group: ProcessGroup | None = None) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        self.loss_fn = loss_fn or nn.BCEWithLogitsLoss()
        self.autocast = autocast
        self.tracer = tracer or Tracer(enabled=False)
        self.group = group
        self.world_size = dist.get_world_size(group) if dist.is_available() and \
            dist.is_initialized() else 1
        self.step = 0
        #: The embedding collections whose forward this pipeline primes (none for base).
        self._primed: list[PrimedForward] = []
        self._items: Iterator[Item] | None = None
        self._ahead: LoadAhead | None = None
        #: True once the items ran out on some rank (every rank then stops).
        self.exhausted = False
        #: Managed-collision remappers: each step tells them the batch's data time (ttl).
        self._collisions = [m for m in model.modules()
                            if isinstance(m, ManagedCollisionCollection)]
        for collisions in self._collisions:  # a data-parallel zch table's rows step here
            collisions.attach_optimizer(optimizer)

    # ---- the interface ------------------------------------------------------------------
    @abc.abstractmethod
    def progress(self, batches: Iterator[Item]) -> StepOutput:
        """Train one step on the next ``(tag, batch)`` of ``batches`` (pass the same iterator
        each call). Raises StopIteration once a rank has no batch left and every batch in
        flight has been trained on."""

    def score(self, batches: Iterator[Item]) -> Iterator[tuple[Tag, Batch, torch.Tensor]]:
        """Forward only, through the pipeline's loading stage: ``(tag, batch, logits)`` per
        item. Every rank must take as many items (the caller pads), and drain the iterator."""
        ahead = LoadAhead(batches, self.device, tracer=self.tracer) if self.loads_ahead \
            else None
        try:
            while True:
                item = ahead.next() if ahead is not None else next(batches, None)
                if item is None:
                    return
                tag, batch = item
                if ahead is None:
                    batch = batch.to(self.device)
                with torch.no_grad(), self.tracer.span("score"):
                    logits = self.forward(batch)
                yield tag, batch, logits
        finally:
            if ahead is not None:
                ahead.close()

    def primed_calls(self) -> int:
        """Embedding forwards that finished work this pipeline started ahead (0 for base)."""
        return sum(p.primed_calls for p in self._primed)

    def close(self, wait: bool = True) -> None:
        """Finish what is in flight (collectives complete on every rank) and stop threads.

        ``wait=False`` (leaving on an error): drop what is in flight without waiting for it,
        since a peer that failed may never complete it."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def __enter__(self) -> TrainPipeline:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.close(wait=kind is None)

    # ---- shared pieces ------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    def forward(self, batch: Batch) -> torch.Tensor:
        """The model's logits for a batch already on the device."""
        if batch.time is not None:
            # The step's data time: its newest row (ranks agree on the max in the remap).
            now = float(batch.time.max()) if batch.time.numel() else None
            for collisions in self._collisions:
                collisions.now = now
        with self._autocast():
            return self.model(batch.dense, batch.sparse)

    def loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.loss_fn(logits.float(), batch.labels)

    def backward_and_step(self, loss: torch.Tensor, step: int) -> None:
        """Backward (tables update here) then the dense optimizer step."""
        with self.tracer.span("backward", step):
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with self.tracer.span("optimizer", step):
            self.optimizer.step()

    def pull(self, batches: Iterator[Item]) -> Item | None:
        """The next item on the device, when every rank has one (None: stop everywhere)."""
        if self._items is not batches:
            if self._ahead is not None:
                self._ahead.close()
            self._items, self._ahead = batches, None
            if self.loads_ahead:
                self._ahead = LoadAhead(batches, self.device, tracer=self.tracer)
        if self.exhausted:
            return None
        if self._ahead is not None:
            item = self._ahead.next()
        else:
            item = next(batches, None)
            if item is not None:
                item = (item[0], item[1].to(self.device))
        with self.tracer.span("agree", self.step):
            if not all_have_batch(item is not None, self.group):
                self.exhausted = True
                return None
        return item

    def output(self, loss: torch.Tensor, tag: Tag, batch: Batch) -> StepOutput:
        self.step += 1
        return StepOutput(loss.detach(), tag, int(batch.labels.shape[0]), self.step)


class BasePipeline(TrainPipeline):
    """The plain loop: each batch loads, distributes, runs forward, backward and the step in
    turn, nothing overlapped (the reference the other pipelines are measured against)."""

    name = "base"

    def progress(self, batches: Iterator[Item]) -> StepOutput:
        step = self.step
        with self.tracer.span("load", step):
            item = self.pull(batches)
        if item is None:
            raise StopIteration
        tag, batch = item
        with self.tracer.span("forward", step):
            loss = self.loss(self.forward(batch), batch)
        self.backward_and_step(loss, step)
        return self.output(loss, tag, batch)
