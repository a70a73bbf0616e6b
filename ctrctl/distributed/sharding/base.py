"""The interface every sharding type implements, and the grouped lookup over a rank's shards.

A sharding type is a factory of three parts, as in TorchRec: ``input_dist`` (move the ids to
the ranks that hold their rows), ``lookup`` (pool the shards held here, the optimizer fused
into backward) and ``output_dist`` (move pooled embeddings back to the samples' ranks).
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

import torch
from torch import nn

from ctrctl.distributed.sharding.common import TableSpec
from ctrctl.distributed.types import ParameterSharding, ShardMetadata
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig


@dataclass
class LocalShard:
    """One shard held by this rank, as checkpoints see it.

    Attributes:
        table: the table's name.
        metadata: its block (rank, offsets, size).
        weight: (rows, cols) tensor, a view of the kernel's storage (writes go through).
        optimizer_state: name -> tensor views (e.g. ``momentum1``: (rows,) for rowwise Adagrad).
    """

    table: str
    metadata: ShardMetadata
    weight: torch.Tensor
    optimizer_state: dict[str, torch.Tensor]


class LocalLookup(nn.Module):
    """Pool several tables at once with FBGEMM's table-batched kernel (optimizer fused).

    Args:
        shapes: (rows, dim) of each local table (a shard of a global table).
        feature_table_map: for each input feature (slot), the index of its table.
        pooling: ``sum`` or ``mean`` (one mode for the whole group).
        optimizer: the fused optimizer.
        weights: optional initial weights, one (rows, dim) tensor per table.

    Input ``indices``/``offsets`` are feature-major over B samples; output (B, sum of the
    features' dims), features in order.
    """

    def __init__(
        self,
        shapes: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int],
        pooling: str,
        optimizer: EmbeddingOptimizerConfig,
        weights: Sequence[torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
        from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode

        kinds = {"exact_rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                 "exact_adagrad": EmbOptimType.EXACT_ADAGRAD,
                 "exact_sgd": EmbOptimType.EXACT_SGD}
        modes = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}
        decay_modes = {"none": WeightDecayMode.NONE, "l2": WeightDecayMode.L2,
                       "decoupled": WeightDecayMode.DECOUPLE}
        self.shapes = [tuple(s) for s in shapes]
        self.feature_dims = [self.shapes[t][1] for t in feature_table_map]
        self.optimizer_kind = optimizer.kind
        self.kernel = SplitTableBatchedEmbeddingBagsCodegen(
            [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, dim in shapes],
            feature_table_map=list(feature_table_map),
            optimizer=kinds[optimizer.kind],
            learning_rate=optimizer.lr,
            eps=optimizer.eps,
            weight_decay=optimizer.weight_decay,
            weight_decay_mode=decay_modes[optimizer.weight_decay_mode],
            pooling_mode=modes[pooling],
        )
        if weights is not None:
            self.load_weights(weights)

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        return self.kernel(indices.long(), offsets.long(), per_sample_weights=per_sample_weights)

    def split_weights(self) -> list[torch.Tensor]:
        """One (rows, dim) view per table."""
        return list(self.kernel.split_embedding_weights())

    def load_weights(self, weights: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for dst, src in zip(self.split_weights(), weights, strict=True):
                dst.copy_(src)

    def optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table, the optimizer's state tensors (views)."""
        states = self.kernel.split_optimizer_states()
        return [{f"momentum{i + 1}": t for i, t in enumerate(table)} for table in states] \
            if states else [{} for _ in self.shapes]

    def get_lr(self) -> float:
        return float(self.kernel.get_learning_rate())

    def set_lr(self, lr: float) -> None:
        self.kernel.set_learning_rate(lr)


class EmbeddingSharding(nn.Module, abc.ABC):
    """The tables of one sharding type in a sharded EmbeddingBagCollection.

    Args:
        tables: the tables of this type, in the collection's order.
        shardings: their plan entries (same order).
        optimizer: the fused optimizer of the lookup.
        group: the process group (default: the world).
        grad_scale: factor applied to embedding gradients on their way back (gradient
            division, see :class:`~ctrctl.distributed.embeddingbag.ShardedEmbeddingBagCollection`).
    """

    sharding_type: str = ""

    def __init__(self, tables: Sequence[TableSpec], shardings: Sequence[ParameterSharding],
                 optimizer: EmbeddingOptimizerConfig, group: object | None = None,
                 grad_scale: float = 1.0) -> None:
        super().__init__()
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

    def fused_lookups(self) -> list[LocalLookup]:
        """The fused kernels of this rank (for the learning rate and the optimizer view)."""
        return [m for m in self.modules() if isinstance(m, LocalLookup)]
