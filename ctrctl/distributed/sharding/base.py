"""The interface every sharding type implements.

A sharding type is three stages, as in TorchRec, each an abstract method here that every type
implements:

1. :meth:`EmbeddingSharding.input_dist`: move the ids to the ranks that hold their rows;
2. :meth:`EmbeddingSharding.lookup`: pool the shards held here (one
   :class:`~ctrctl.modules.batched_embedding.BatchedEmbeddingBag` per run of tables, the
   optimizer fused into backward);
3. :meth:`EmbeddingSharding.output_dist`: move the pooled embeddings back to the samples'
   ranks and put them in feature order.

:meth:`EmbeddingSharding.forward` composes them (a train pipeline can call them as separate
stages), and :meth:`EmbeddingSharding.local_shards` exposes the shards held for checkpoints.
:meth:`EmbeddingSharding.start_input_dist` is stage 1 started rather than run: a
:class:`PendingInput` whose communication is in flight while the caller computes (the
``sparse-dist`` train pipeline starts batch i+1's while batch i trains).

Example:
    >>> sharding = TwSharding(tables, shardings, optimizer, group=None)
    >>> pooled = sharding(lengths, values, weights)       # (B_local, sum of feature dims)
    >>> received = sharding.input_dist(lengths, values, weights)     # the same, by stage
    >>> pooled = sharding.output_dist(sharding.lookup(received), received, lengths)
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from ctrctl.distributed.types import ParameterSharding, ShardMetadata
from ctrctl.modules.batched_embedding import BatchedEmbeddingBag
from ctrctl.modules.cached_embedding import CachedEmbeddingBag, CachedTableSpec
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig

#: What a type's input dist hands its lookup (the ids this rank pools, and their sources).
DistInput = TypeVar("DistInput")


@dataclass
class LocalShard:
    """One shard held by this rank, as checkpoints see it.

    Attributes:
        table: the table's name.
        metadata: its block (rank, offsets, size).
        weight: (rows, cols) tensor, a view of the kernel's storage (writes go through).
        optimizer_state: name -> tensor views (e.g. ``momentum1``: (rows,) for rowwise Adagrad).
        replicated: a data-parallel replica (every rank holds the same; save it once).
    """

    table: str
    metadata: ShardMetadata
    weight: torch.Tensor
    optimizer_state: dict[str, torch.Tensor]
    replicated: bool = False


class PendingInput(Generic[DistInput]):
    """A started input distribution: :meth:`launch` sends the data once the sizes are known,
    :meth:`wait` gives the stage's result (launching first when needed).

    The base class holds a result already computed (types whose input dist does not
    communicate, or ran synchronously).
    """

    def __init__(self, result: DistInput) -> None:
        self._result = result

    def launch(self) -> None:
        """Wait for the split sizes and put the data exchange in flight (idempotent)."""

    def wait(self) -> DistInput:
        return self._result


class EmbeddingSharding(nn.Module, abc.ABC, Generic[DistInput]):
    """The tables of one sharding type in a sharded EmbeddingBagCollection.

    Args:
        tables: the tables of this type, in the collection's order.
        shardings: their plan entries (same order).
        optimizer: the fused optimizer of the lookup.
        group: the process group (default: the world).
        grad_scale: factor applied to embedding gradients on their way back (gradient
            division, see :class:`~ctrctl.distributed.embeddingbag.ShardedEmbeddingBagCollection`).
        backend: the lookup kernel, ``auto`` (FBGEMM when it runs here), ``fbgemm`` or
            ``torch`` (see :class:`~ctrctl.modules.batched_embedding.BatchedEmbeddingBag`).
        cached: table name -> how it is cached, for tables whose shards live on disk with a
            DRAM row cache (the ``fused_cached`` kernel,
            :class:`~ctrctl.modules.cached_embedding.CachedEmbeddingBag`).
    """

    sharding_type: str = ""
    #: Whether the group takes a deduplicated batch (a variable batch per feature, see
    #: :mod:`ctrctl.distributed.sharding.variable_batch`); others get every sample's bags.
    supports_dedup: bool = False

    def __init__(self, tables: Sequence[EmbeddingBagConfig], shardings: Sequence[ParameterSharding],
                 optimizer: EmbeddingOptimizerConfig, group: Any | None = None,
                 grad_scale: float = 1.0, backend: str = "auto",
                 cached: Mapping[str, CachedTableSpec] | None = None) -> None:
        super().__init__()
        self.backend = backend
        self.cached = dict(cached or {})
        self.tables = list(tables)
        self.shardings = list(shardings)
        self.optimizer = optimizer
        self.group = group
        self.grad_scale = grad_scale

    @property
    def feature_names(self) -> list[str]:
        return [f for t in self.tables for f in t.feature_names]

    @property
    def feature_dims(self) -> list[int]:
        return [t.embedding_dim for t in self.tables for _ in t.feature_names]

    @abc.abstractmethod
    def input_dist(self, lengths: torch.Tensor, values: torch.Tensor,
                   weights: torch.Tensor | None) -> DistInput:
        """Stage 1: this rank's (F, B_local) lengths and feature-major ids (and weights) of
        this group's features -> what this rank must pool, from every source rank."""

    def start_input_dist(self, lengths: torch.Tensor, values: torch.Tensor,
                         weights: torch.Tensor | None) -> PendingInput[DistInput]:
        """Stage 1, started: returns while its communication is in flight (every rank starts
        its groups' input dists in the same order). Default: run it now."""
        return PendingInput(self.input_dist(lengths, values, weights))

    @abc.abstractmethod
    def lookup(self, dist_input: DistInput) -> torch.Tensor:
        """Stage 2: pool the shards held here for the ids received -> (rows, width) partial
        or whole pooled embeddings (the fused optimizer updates them in backward)."""

    @abc.abstractmethod
    def output_dist(self, pooled: torch.Tensor, dist_input: DistInput,
                    lengths: torch.Tensor) -> torch.Tensor:
        """Stage 3: pooled embeddings back to their samples' ranks -> (B_local, sum of
        feature dims) in feature order. ``lengths`` are this rank's input lengths (F, B_local)
        (mean pooling of tables cut by rows divides by the whole bag's length here)."""

    def forward(self, lengths: torch.Tensor, values: torch.Tensor,
                weights: torch.Tensor | None) -> torch.Tensor:
        """(F, B_local) lengths and feature-major ids of this group's features ->
        (B_local, sum of feature dims): the three stages in order."""
        dist_input = self.input_dist(lengths, values, weights)
        return self.output_dist(self.lookup(dist_input), dist_input, lengths)

    @abc.abstractmethod
    def local_shards(self, tables: Collection[str] | None = None) -> list[LocalShard]:
        """The shards this rank holds (weights and optimizer state as views); ``tables``:
        at least those of these tables (kernels holding none of them are not read)."""

    def fused_lookups(self) -> list[BatchedEmbeddingBag | CachedEmbeddingBag]:
        """The fused kernels of this rank (for the learning rate and the optimizer view)."""
        return [m for m in self.modules()
                if isinstance(m, (BatchedEmbeddingBag, CachedEmbeddingBag))]

    def cached_kernels(self) -> list[CachedEmbeddingBag]:
        """This rank's kernels over cached shards."""
        return [m for m in self.modules() if isinstance(m, CachedEmbeddingBag)]

    def prefetch(self, pending: PendingInput[DistInput]) -> None:
        """Start bringing the rows of a coming batch (its input dist, in flight) into cached
        shards' caches; a no-op without cached shards."""
