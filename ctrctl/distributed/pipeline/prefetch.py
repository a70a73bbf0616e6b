"""``prefetch``: ``sparse-dist``, plus batch i+1's rows brought into cached tables' caches.

Tables kept on disk with a DRAM row cache (``model.cached_tables``, the ``fused_cached``
kernel, :class:`~ctrctl.modules.cached_embedding.CachedEmbeddingBag`) read a batch's missing
rows from their file. Sharded, each rank prefetches the rows of its shards for the ids it
receives: batch i+1's id exchange, launched after forward(i), is waited for first. This pipeline asks for batch i+1's rows between forward(i) and
backward(i): the cache's worker thread looks them up, evicts rows no batch holds, writes
dirty victims back and reads the misses while batch i runs backward (whose update waits for
the prefetch, so no row moves under it). Forward(i+1) then finds every row in DRAM: its
misses are zero. The numerics are those of ``base``.

Example:
    >>> pipeline = PrefetchPipeline(model, dense_optimizer, torch.device("cpu"))
    >>> out = pipeline.progress(items)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection
from ctrctl.distributed.pipeline.sparse_dist import InFlight, SparseDistPipeline
from ctrctl.modules.cached_embedding import CachedEmbeddingBag
from ctrctl.modules.embedding_modules import EmbeddingBagCollection

__all__ = ["PrefetchPipeline", "cached_collections"]


def cached_collections(model: nn.Module) -> list[nn.Module]:
    """Every embedding collection in ``model`` that holds a cached table (or, sharded, a
    cached shard on this rank)."""
    return [m for m in model.modules()
            if (isinstance(m, EmbeddingBagCollection) and m.cache_counters())
            or (isinstance(m, ShardedEmbeddingBagCollection) and m.cached_kernels())]


class PrefetchPipeline(SparseDistPipeline):
    """``sparse-dist`` with cached tables' rows prefetched one batch ahead."""

    name = "prefetch"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 device: torch.device, **kwargs: Any) -> None:
        super().__init__(model, optimizer, device, **kwargs)
        self._cached = cached_collections(model)

    def prefetch(self, upcoming: InFlight | None, step: int) -> None:
        if upcoming is None:
            return
        with self.tracer.span("prefetch", step):
            for collection in self._cached:
                if isinstance(collection, EmbeddingBagCollection):
                    collection.prefetch(upcoming.batch.sparse)
            # sharded: the rows this rank holds of the ids it receives (their exchange, in
            # flight since launch, is waited for here)
            for primed, dist_input in zip(self._primed, upcoming.dists, strict=True):
                module = primed.module
                if isinstance(module, ShardedEmbeddingBagCollection) and module.cached_kernels():
                    module.prefetch(dist_input)

    def after_forward(self, current: InFlight, upcoming: InFlight | None, step: int) -> None:
        super().after_forward(current, upcoming, step)
        self.prefetch(upcoming, step)

    def after_score(self, upcoming: InFlight | None) -> None:
        self.prefetch(upcoming, self.step)

    def close(self, wait: bool = True) -> None:
        super().close(wait)
        # the batch read ahead is not trained: its rows are not held any longer
        for module in self.model.modules():
            if isinstance(module, CachedEmbeddingBag):
                module.drop_prefetch()
