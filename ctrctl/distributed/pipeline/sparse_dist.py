"""``sparse-dist``: three batches in flight, the ids' all-to-all hidden behind backward.

One step, for batch i (batch i+1 was read last step; its split sizes are on their way)::

    load thread:  batch i+2 read and moved to the device (pinned memory + side stream on CUDA)
    main:         start input dist(i+1): route its ids, split sizes all-to-all in flight
                  forward(i): waits for i's ids (sent during the last step), pools, returns
                  launch input dist(i+1): lengths and ids all-to-all in flight ...
                  backward(i), optimizer step    ... while they travel

On CPU the overlap is real: gloo runs ``all_to_all_single(async_op=True)`` on its own
threads. The numerics are those of ``base`` (bitwise: the same kernels see the same ids
and weights in the same order); only the timing changes.

Example:
    >>> pipeline = SparseDistPipeline(dmp, dense_optimizer, torch.device("cpu"))
    >>> out = pipeline.progress(items)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from ctrctl.distributed.embeddingbag import EBCInputDist, ShardedEmbeddingBagCollection
from ctrctl.distributed.pipeline.base import StepOutput, TrainPipeline
from ctrctl.distributed.pipeline.stages import LoadAhead, PrimedForward
from ctrctl.distributed.pipeline.types import Batch, Item, Tag

__all__ = ["SparseDistPipeline", "sharded_collections"]


def sharded_collections(model: nn.Module) -> list[ShardedEmbeddingBagCollection]:
    """Every sharded embedding collection in ``model`` (outermost first)."""
    return [m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection)]


@dataclass
class InFlight:
    """A batch read ahead, with its input distribution started in every sharded collection."""

    tag: Tag
    batch: Batch
    dists: list[EBCInputDist] = field(default_factory=list)

    def launch(self) -> None:
        for d in self.dists:
            d.launch()

    def wait(self) -> None:
        """Complete every exchange (when a batch is dropped: the ranks stay matched)."""
        for d in self.dists:
            for pending in d.pending:
                pending.wait()


class SparseDistPipeline(TrainPipeline):
    """Load ahead on a thread; batch i+1's input distribution overlaps batch i's backward."""

    name = "sparse-dist"
    loads_ahead = True

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 device: torch.device, **kwargs: Any) -> None:
        super().__init__(model, optimizer, device, **kwargs)
        self._primed = [PrimedForward.install(m) for m in sharded_collections(model)]
        self._next: InFlight | None = None
        self._started = False

    def start(self, item: Item, step: int) -> InFlight:
        """Stage 2, first half: route the batch's ids and send the split sizes."""
        tag, batch = item
        with self.tracer.span("input_dist.splits", step):
            return InFlight(tag, batch, [cast(ShardedEmbeddingBagCollection, p.module)
                                         .input_dist(batch.sparse) for p in self._primed])

    def prime(self, flight: InFlight) -> None:
        """Make the model's forward finish this batch's input distribution, not start one."""
        for primed, d in zip(self._primed, flight.dists, strict=True):
            module = primed.module
            assert isinstance(module, ShardedEmbeddingBagCollection)
            primed.prime(flight.batch.sparse, partial(module.compute_and_output_dist, d))

    def launch(self, flight: InFlight, step: int) -> None:
        with self.tracer.span("input_dist.launch", step):
            flight.launch()

    def after_forward(self, current: InFlight, upcoming: InFlight | None, step: int) -> None:
        """Between forward(i) and backward(i): batch i+1's ids go on their way."""
        if upcoming is not None:
            self.launch(upcoming, step)

    def progress(self, batches: Iterator[Item]) -> StepOutput:
        step = self.step
        if not self._started:
            self._started = True
            first = self.pull(batches)
            if first is not None:
                self._next = self.start(first, step)
                self.launch(self._next, step)
                self.after_score(self._next)  # the first batch: nothing to overlap with
        current = self._next
        if current is None:
            raise StopIteration
        item = self.pull(batches)
        upcoming = self.start(item, step) if item is not None else None
        self.prime(current)
        with self.tracer.span("forward", step):
            loss = self.loss(self.forward(current.batch), current.batch)
        self.after_forward(current, upcoming, step)
        self.backward_and_step(loss, step)
        self._next = upcoming
        return self.output(loss, current.tag, current.batch)

    def score(self, batches: Iterator[Item]) -> Iterator[tuple[Tag, Batch, torch.Tensor]]:
        """Forward only with the same stages: batch i+1's ids travel while batch i scores."""
        ahead = LoadAhead(batches, self.device, tracer=self.tracer)
        upcoming: InFlight | None = None
        try:
            item = ahead.next()
            current = self.start(item, self.step) if item is not None else None
            if current is not None:
                current.launch()
                self.after_score(current)
            while current is not None:
                item = ahead.next()
                upcoming = self.start(item, self.step) if item is not None else None
                self.prime(current)
                with torch.no_grad(), self.tracer.span("score", self.step):
                    logits = self.forward(current.batch)
                if upcoming is not None:
                    upcoming.launch()
                self.after_score(upcoming)
                yield current.tag, current.batch, logits
                current, upcoming = upcoming, None
        finally:
            ahead.close()
            for p in self._primed:
                p.clear()
            if upcoming is not None:
                upcoming.wait()

    def after_score(self, upcoming: InFlight | None) -> None:
        """Before a batch's forward when there is no backward to overlap (the first batch,
        scoring): the prefetch pipeline brings its rows in here."""

    def close(self, wait: bool = True) -> None:
        if self._next is not None and wait:  # read ahead but not trained: finish its exchange
            self._next.wait()
        self._next = None
        for p in self._primed:
            p.remove()
        super().close(wait)
