"""Data-parallel sharding: every rank holds a full replica of the table.

No input distribution: each rank pools its own samples. The tables are plain dense
parameters (the ``dense`` compute kernel); their gradients are all-reduced with the rest of the
dense model (DDP in :class:`~ctrctl.distributed.model_parallel.DistributedModelParallel`, or
:meth:`DpSharding.all_reduce_gradients` when used alone) and the dense optimizer the training
loop builds over ``dense_parameters()`` updates them, identically on every rank.

Example:
    >>> group = DpSharding(tables, shardings, EmbeddingOptimizerConfig())
    >>> out = group(lengths, values, None)          # (B, D), no communication
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ctrctl.distributed import comm
from ctrctl.distributed.sharding.base import EmbeddingSharding, LocalShard
from ctrctl.distributed.types import ParameterSharding, ShardMetadata
from ctrctl.errors import PlanError
from ctrctl.modules.cached_embedding import CachedTableSpec
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.names import ShardingType


@dataclass
class LocalBags:
    """A data-parallel input dist's output: this rank's own bags, unmoved."""

    lengths: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor | None


class DpSharding(EmbeddingSharding[LocalBags]):
    """Replicated dense tables (see the module docstring)."""

    sharding_type = ShardingType.DATA_PARALLEL.value

    def __init__(self, tables: Sequence[EmbeddingBagConfig], shardings: Sequence[ParameterSharding],
                 optimizer: EmbeddingOptimizerConfig, group: Any | None = None,
                 grad_scale: float = 1.0, backend: str = "auto",
                 cached: Mapping[str, CachedTableSpec] | None = None) -> None:
        super().__init__(tables, shardings, optimizer, group, grad_scale, backend, cached)
        replicated_cached = [t.name for t in self.tables if t.name in self.cached]
        if replicated_cached:
            raise PlanError(f"tables {replicated_cached} are cached and planned data_parallel, "
                            "whose replicas are dense parameters in memory",
                            hint="plan them table_wise or row_wise")
        self.rank = dist.get_rank(group)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(t.num_embeddings, t.embedding_dim).uniform_(
                -(1.0 / t.num_embeddings) ** 0.5, (1.0 / t.num_embeddings) ** 0.5))
            for t in self.tables)
        self.table_of_feature = [i for i, t in enumerate(self.tables) for _ in t.feature_names]

    # ---- the three stages: no communication, every rank pools its own samples -----------
    def input_dist(self, lengths: torch.Tensor, values: torch.Tensor,
                   weights: torch.Tensor | None) -> LocalBags:
        return LocalBags(lengths, values, weights)

    def lookup(self, dist_input: LocalBags) -> torch.Tensor:
        lengths, values, weights = dist_input.lengths, dist_input.values, dist_input.weights
        per_feature = lengths.sum(dim=1).tolist()
        values_f = values.split(per_feature)
        weights_f = weights.split(per_feature) if weights is not None else None
        out = []
        for f, t in enumerate(self.table_of_feature):
            offsets = torch.zeros(lengths.shape[1] + 1, dtype=torch.long, device=lengths.device)
            torch.cumsum(lengths[f].long(), 0, out=offsets[1:])
            mode = self.tables[t].pooling
            out.append(F.embedding_bag(
                values_f[f].long(), self.weights[t], offsets[:-1], mode=mode,
                per_sample_weights=weights_f[f] if weights_f is not None else None,
                include_last_offset=False))                                    # (B, dim)
        return torch.cat(out, dim=1)                                           # (B, D)

    def output_dist(self, pooled: torch.Tensor, dist_input: LocalBags,
                    lengths: torch.Tensor) -> torch.Tensor:
        return pooled  # already this rank's samples, in feature order

    def all_reduce_gradients(self) -> None:
        """Average the tables' gradients over ranks (what DDP does for them inside DMP)."""
        for p in self.weights:
            if p.grad is not None:
                comm.all_reduce_(p.grad, self.group, average=True)

    def local_shards(self, tables: Collection[str] | None = None) -> list[LocalShard]:
        return [LocalShard(t.name, ShardMetadata(self.rank, 0, 0, t.num_embeddings,
                                                 t.embedding_dim), w.data, {},
                           replicated=True)
                for t, w in zip(self.tables, self.weights, strict=True)]
