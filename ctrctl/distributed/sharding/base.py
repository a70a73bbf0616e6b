"""The interface every sharding type implements.

A sharding type is a factory of three parts, as in TorchRec: ``input_dist`` (move the ids to
the ranks that hold their rows), ``lookup`` (pool the shards held here with one
:class:`~ctrctl.modules.batched_embedding.BatchedEmbeddingBag`, the optimizer fused into
backward) and ``output_dist`` (move pooled embeddings back to the samples' ranks).
:class:`EmbeddingSharding` runs them in order for the tables of one sharding type, and exposes
the shards it holds for checkpoints (:meth:`EmbeddingSharding.local_shards`).

Example:
    >>> sharding = TwSharding(tables, shardings, optimizer, group=None)
    >>> pooled = sharding(lengths, values, weights)       # (B_local, sum of feature dims)
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ctrctl.distributed.types import ParameterSharding, ShardMetadata
from ctrctl.modules.batched_embedding import BatchedEmbeddingBag
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig


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


class EmbeddingSharding(nn.Module, abc.ABC):
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
    """

    sharding_type: str = ""

    def __init__(self, tables: Sequence[EmbeddingBagConfig], shardings: Sequence[ParameterSharding],
                 optimizer: EmbeddingOptimizerConfig, group: Any | None = None,
                 grad_scale: float = 1.0, backend: str = "auto") -> None:
        super().__init__()
        self.backend = backend
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
    def forward(self, lengths: torch.Tensor, values: torch.Tensor,
                weights: torch.Tensor | None) -> torch.Tensor:
        """(F, B_local) lengths and feature-major ids of this group's features ->
        (B_local, sum of feature dims)."""

    @abc.abstractmethod
    def local_shards(self) -> list[LocalShard]:
        """The shards this rank holds (weights and optimizer state as views)."""

    def fused_lookups(self) -> list[BatchedEmbeddingBag]:
        """The fused kernels of this rank (for the learning rate and the optimizer view)."""
        return [m for m in self.modules() if isinstance(m, BatchedEmbeddingBag)]
