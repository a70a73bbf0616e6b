"""``semi-sync``: batch i+1's embedding lookup overlaps batch i's dense backward.

This changes the numerics, and is off by default. From ``start_step`` on, right after
forward(i) the embedding collections' whole forward for batch i+1 (input dist, lookup,
output dist) runs on a worker thread while the main thread runs batch i's dense backward;
a hook on batch i's pooled embeddings holds their gradient back until that lookup is done,
so batch i's fused table update lands after it. Batch i+1 therefore pools the weights as
they were before batch i's update: one step older than ``base`` would use. Before
``start_step`` it runs synchronously (as ``base``, with loading ahead), so the first steps,
when the weights move most, see fresh embeddings.

Two constraints keep it correct: every table must be on a fused kernel (a data-parallel
table's weight is stepped by the dense optimizer while the lookup of the next batch holds it),
and at world size > 1 the dense gradients must be all-reduced on a process group of their own
(``DistributedModelParallel(dense_process_group=...)``): the embedding worker's collectives
then never interleave with DDP's.

Example:
    >>> pipeline = SemiSyncPipeline(model, dense_optimizer, torch.device("cpu"), start_step=100)
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection
from ctrctl.distributed.model_parallel import DistributedModelParallel
from ctrctl.distributed.pipeline.base import StepOutput, TrainPipeline
from ctrctl.distributed.pipeline.stages import PrimedForward
from ctrctl.distributed.pipeline.types import Batch, Item, Tag
from ctrctl.distributed.sharding.base import EmbeddingSharding
from ctrctl.errors import ConfigError
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.names import ShardingType
from ctrctl.sparse.keyed_tensor import KeyedTensor

__all__ = ["SemiSyncPipeline", "embedding_collections"]

#: Default first step that looks up ahead.
DEFAULT_START_STEP = 100


def embedding_collections(model: nn.Module) -> list[nn.Module]:
    """The outermost embedding collections of ``model``, sharded or not."""
    found: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, (ShardedEmbeddingBagCollection, EmbeddingBagCollection)) and not any(
                name.startswith(f + ".") for f, _ in found if f):
            found.append((name, m))
    return [m for _, m in found]


def _result(lookup: Future[list[KeyedTensor]], i: int) -> KeyedTensor:
    return lookup.result()[i]


@dataclass
class _Ahead:
    tag: Tag
    batch: Batch
    lookup: Future[list[KeyedTensor]] | None = None


class SemiSyncPipeline(TrainPipeline):
    """Embedding lookups one batch ahead, on weights one step older (see the module docstring).

    Args:
        start_step: the first step whose next batch is looked up ahead (before it: sync).
    """

    name = "semi-sync"
    exact = False
    loads_ahead = True

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 device: torch.device, *, start_step: int = DEFAULT_START_STEP,
                 **kwargs: Any) -> None:
        super().__init__(model, optimizer, device, **kwargs)
        self.start_step = start_step
        collections = embedding_collections(model)
        replicated = [t.name for m in collections if isinstance(m, ShardedEmbeddingBagCollection)
                      and ShardingType.DATA_PARALLEL.value in m.groups
                      for t in cast(EmbeddingSharding,
                                    m.groups[ShardingType.DATA_PARALLEL.value]).tables]
        if replicated:
            raise ConfigError(
                f"semi-sync looks embeddings up one step ahead, which data-parallel tables "
                f"({', '.join(replicated)}) cannot do: the dense optimizer steps them",
                where="training.pipeline", hint="plan them on another sharding type, or use "
                "the sparse-dist pipeline")
        if self.world_size > 1 and not (isinstance(model, DistributedModelParallel)
                                        and model.dense_process_group is not None):
            raise ConfigError(
                "semi-sync at world size > 1 needs the dense gradients all-reduced on a "
                "process group of their own", where="training.pipeline",
                hint="wrap with DistributedModelParallel(..., dense_process_group="
                     "comm.new_group(ranks))")
        self._primed = [PrimedForward.install(m) for m in collections]
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctrctl-semi-sync")
        self._next: _Ahead | None = None
        self._started = False

    def _lookup(self, batch: Batch, step: int) -> list[KeyedTensor]:
        with self.tracer.span("embedding_ahead", step), self._autocast():
            return [p.original(batch.sparse) for p in self._primed]

    def progress(self, batches: Iterator[Item]) -> StepOutput:
        step = self.step
        if not self._started:
            self._started = True
            first = self.pull(batches)
            self._next = _Ahead(*first) if first is not None else None
        current = self._next
        if current is None:
            raise StopIteration
        item = self.pull(batches)
        upcoming = _Ahead(*item) if item is not None else None
        if current.lookup is not None:
            lookup = current.lookup
            for i, primed in enumerate(self._primed):
                primed.prime(current.batch.sparse, partial(_result, lookup, i))
        with self.tracer.span("forward", step):
            loss = self.loss(self.forward(current.batch), current.batch)
        pooled = [p.last for p in self._primed]
        if upcoming is not None and step + 1 >= self.start_step:
            future = self._worker.submit(self._lookup, upcoming.batch, step + 1)
            upcoming.lookup = future
            for kt in pooled:
                values = kt.values() if kt is not None else None
                if values is not None and values.requires_grad:
                    # batch i's table update waits for batch i+1's lookup
                    values.register_hook(lambda grad, f=future: (f.result(), grad)[1])
        self.backward_and_step(loss, step)
        if upcoming is not None and upcoming.lookup is not None:
            upcoming.lookup.result()  # done by now (the hook waited); raises its error
        self._next = upcoming
        return self.output(loss, current.tag, current.batch)

    def close(self, wait: bool = True) -> None:
        if self._next is not None and self._next.lookup is not None and wait:
            self._next.lookup.result()
        self._next = None
        self._worker.shutdown(wait=wait)
        for p in self._primed:
            p.remove()
        super().close(wait)
