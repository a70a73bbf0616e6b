"""Table-batched embedding bags in plain torch, with the optimizer fused into backward.

The reference for FBGEMM's TBE (same inputs, outputs and update numerics) and the kernel that
runs where fbgemm_gpu is missing (e.g. a GPU with torch only). Tables of one dim are stored as
one flat (sum of rows, dim) weight, so a batch of all features of that dim is a single
``F.embedding_bag`` call with ids shifted by each table's first row::

    tables   t0 (3 rows)  t1 (2 rows)          flat weight rows: t0 -> 0..2, t1 -> 3..4
    features f0 -> t0, f1 -> t1, f2 -> t0      shift per feature: [0, 3, 0]

Backward sums the gradients of repeated rows, then updates each touched row once with
:func:`ctrctl.modules.optimizers.apply_sparse_update`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules.optimizers import (
    CPU_OPTIMIZERS,
    EmbeddingOptimizerConfig,
    apply_sparse_update,
    init_state,
    unsupported_optimizer_error,
)
from ctrctl.sparse.ops import complete_cumsum, segment_ranges


def pool_bags(
    ids: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled rows of ``weight`` per bag, and each bag's length.

    Args:
        ids: 1-D row of ``weight`` per value.
        weight: (rows, D).
        offsets: (bags + 1,) bag boundaries into ``ids``.
        pooling: "sum" or "mean" (an empty bag pools to zeros either way).
        per_sample_weights: optional 1-D weight per value.

    Returns:
        (bags, D) pooled embeddings and (bags,) lengths.
    """
    pooled = F.embedding_bag(
        ids,
        weight,
        offsets,
        mode="sum",
        per_sample_weights=per_sample_weights,
        include_last_offset=True,
    )  # (bags, D)
    lengths = offsets[1:] - offsets[:-1]
    if pooling == "mean":
        pooled = pooled / lengths.clamp(min=1).unsqueeze(1).to(pooled.dtype)
    return pooled, lengths


def row_gradients(
    grad_out: torch.Tensor,
    ids: torch.Tensor,
    lengths: torch.Tensor,
    weight: torch.Tensor,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
    needs_weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The backward of :func:`pool_bags`: the gradient of each distinct row, summed.

    Repeated ids are summed first, in the ids' order ("exact" optimizers, as FBGEMM), so every
    kernel that calls this updates a row with the same bits. Read ``weight`` before updating it:
    the per-sample-weight gradient needs the old rows.

    Args:
        grad_out: (bags, D) gradient of the pooled output.
        ids, lengths: the rows read and the bag lengths, as :func:`pool_bags` saw them.
        weight: (rows, D).
        pooling: "sum" or "mean".
        per_sample_weights: the forward's weights per value, or None.
        needs_weight_grad: whether to return the gradient of ``per_sample_weights``.

    Returns:
        The distinct rows (sorted), their (distinct rows, D) summed gradient, and the (n,)
        gradient of ``per_sample_weights`` (None unless asked for).
    """
    if pooling == "mean":
        grad_out = grad_out / lengths.clamp(min=1).unsqueeze(1).to(grad_out.dtype)
    bag_of_value = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device),
        lengths,
        output_size=ids.numel(),
    )
    grad_values = grad_out[bag_of_value]  # (n, D)
    grad_weights = None
    if per_sample_weights is not None:
        if needs_weight_grad:
            grad_weights = (grad_values * weight[ids]).sum(dim=1)  # before the update
        grad_values = grad_values * per_sample_weights.unsqueeze(1)
    rows, inverse = torch.unique(ids, return_inverse=True)
    summed = torch.zeros(rows.numel(), weight.size(1), dtype=grad_values.dtype, device=weight.device)
    summed.index_add_(0, inverse, grad_values)  # "exact": repeated ids summed first
    return rows, summed, grad_weights


class _DimGroup:
    """Tables of one dim sharing a flat weight, and the features that look them up."""

    def __init__(self, dim: int, tables: list[int], rows: list[int], features: list[int]) -> None:
        self.dim = dim
        self.tables = tables  # global table indices, in flat-weight order
        self.table_row_offset = dict(zip(tables, [0, *itertools.accumulate(rows)], strict=False))
        self.total_rows = sum(rows)
        self.features = features  # global feature indices, in batch order


class _PooledLookup(torch.autograd.Function):
    """embedding_bag forward; backward updates the weight in place and returns no grad for it."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        trigger: torch.Tensor,
        kernel: TorchTableBatchedEmbeddingBags,
        group: int,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        weight = kernel.flat_weights[group]
        pooled, lengths = pool_bags(indices, weight, offsets, kernel.pooling, per_sample_weights)
        ctx.kernel, ctx.group = kernel, group
        ctx.save_for_backward(indices, lengths, per_sample_weights)
        return pooled

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # (bags, D)
        indices, lengths, per_sample_weights = ctx.saved_tensors
        kernel: TorchTableBatchedEmbeddingBags = ctx.kernel
        weight = kernel.flat_weights[ctx.group]
        rows, summed, grad_weights = row_gradients(
            grad_out, indices, lengths, weight, kernel.pooling,
            per_sample_weights, ctx.needs_input_grad[5],
        )
        apply_sparse_update(
            kernel.optimizer, kernel.learning_rate, weight, kernel.states[ctx.group], rows, summed
        )
        return None, None, None, None, None, grad_weights


class TorchTableBatchedEmbeddingBags(nn.Module):
    """Plain-torch table-batched embedding bags with a fused sparse optimizer.

    Args:
        tables: (rows, dim) per table.
        feature_table_map: the table each feature looks up (default: feature i -> table i).
        optimizer: the fused optimizer.
        pooling: "sum" or "mean".
        device: where the weights live.

    Example:
        >>> tbe = TorchTableBatchedEmbeddingBags([(100, 8), (50, 4)],
        ...                                      optimizer=EmbeddingOptimizerConfig())
        >>> tbe(indices, offsets).shape           # (B, 12)
    """

    def __init__(
        self,
        tables: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int] | None = None,
        optimizer: EmbeddingOptimizerConfig | None = None,
        pooling: str = "sum",
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.optimizer = optimizer or EmbeddingOptimizerConfig()
        device = torch.device(device or "cpu")
        if self.optimizer.kind not in CPU_OPTIMIZERS:
            raise unsupported_optimizer_error(self.optimizer.kind, device, "torch")
        if pooling not in ("sum", "mean"):
            raise ConfigError(
                f"unknown pooling {pooling!r}", where="TorchTableBatchedEmbeddingBags"
            )
        self.tables = [(int(r), int(d)) for r, d in tables]
        self.feature_table_map = list(feature_table_map or range(len(self.tables)))
        self.pooling = pooling
        self.learning_rate = self.optimizer.lr
        self.feature_dims = [self.tables[t][1] for t in self.feature_table_map]

        dims = list(dict.fromkeys(d for _, d in self.tables))
        self.groups: list[_DimGroup] = []
        for dim in dims:
            members = [t for t, (_, d) in enumerate(self.tables) if d == dim]
            features = [f for f, t in enumerate(self.feature_table_map) if self.tables[t][1] == dim]
            self.groups.append(
                _DimGroup(dim, members, [self.tables[t][0] for t in members], features)
            )
        self.flat_weights: list[torch.Tensor] = []
        self.states: list[dict[str, torch.Tensor]] = []
        for i, group in enumerate(self.groups):
            weight = torch.zeros(group.total_rows, group.dim, device=device)
            self.register_buffer(f"flat_weight_{i}", weight)
            self.flat_weights.append(weight)
            state = init_state(self.optimizer.kind, group.total_rows, group.dim, device)
            for name, tensor in state.items():
                self.register_buffer(f"{name}_{i}", tensor)
            self.states.append(state)
        self._group_of_table = {t: g for g, group in enumerate(self.groups) for t in group.tables}
        # One shift per feature (row offset of its table inside its group's flat weight).
        self._feature_shift = [
            self.groups[self._group_of_table[t]].table_row_offset[t] for t in self.feature_table_map
        ]
        self._needs_shift = any(self._feature_shift)
        self._shift_cache: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._single_group = len(self.groups) == 1
        # An empty tensor that requires grad, so backward runs for a weight that has no grad.
        self._trigger = torch.zeros(0, requires_grad=True)

    def _apply(self, fn: Any, recurse: bool = True) -> TorchTableBatchedEmbeddingBags:
        super()._apply(fn, recurse)
        # Buffers were replaced (e.g. by .to(device)): refresh the lists that alias them.
        self.flat_weights = [getattr(self, f"flat_weight_{i}") for i in range(len(self.groups))]
        self.states = [
            {name: getattr(self, f"{name}_{i}") for name in self.optimizer.state_names}
            for i in range(len(self.groups))
        ]
        return self

    def set_learning_rate(self, lr: float) -> None:
        self.learning_rate = float(lr)

    def _lookup(
        self,
        group_index: int,
        features: list[int],
        indices: torch.Tensor,
        offsets: torch.Tensor,
        feature_offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        if self._needs_shift:
            counts = feature_offsets[1:] - feature_offsets[:-1]  # values per feature
            cache_key = (group_index, indices.device)
            shift = self._shift_cache.get(cache_key)
            if shift is None:  # built once per group and device, not per batch
                shift = torch.tensor(
                    [self._feature_shift[f] for f in features], device=indices.device
                )
                self._shift_cache[cache_key] = shift
            indices = indices + torch.repeat_interleave(shift, counts, output_size=indices.numel())
        trigger = self._trigger if torch.is_grad_enabled() else self._trigger.detach()
        return _PooledLookup.apply(trigger, self, group_index, indices, offsets, per_sample_weights)

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pooled embeddings (B, sum of feature dims), features in ``feature_table_map`` order.

        Args:
            indices: 1-D int64 ids, feature-major (all ids of feature 0 first).
            offsets: (T * B + 1,) bag boundaries into ``indices``.
            per_sample_weights: optional 1-D float weight per id.
        """
        num_features = len(self.feature_table_map)
        batch = (offsets.numel() - 1) // num_features
        indices = indices.long()
        offsets = offsets.long()
        feature_offsets = offsets[::batch] if batch > 0 else offsets.new_zeros(num_features + 1)
        if batch == 0:
            return torch.zeros(0, sum(self.feature_dims), device=self.flat_weights[0].device)
        if self._single_group:
            features = self.groups[0].features
            pooled = self._lookup(
                0, features, indices, offsets, feature_offsets, per_sample_weights
            )
            dim = self.groups[0].dim
            return pooled.view(num_features, batch, dim).transpose(0, 1).reshape(batch, -1)
        lengths = (offsets[1:] - offsets[:-1]).view(num_features, batch)
        blocks: list[torch.Tensor | None] = [None] * num_features
        for g, group in enumerate(self.groups):
            if not group.features:
                continue
            chosen = torch.tensor(group.features, device=indices.device)
            positions = segment_ranges(feature_offsets, chosen, chosen + 1)
            group_offsets = complete_cumsum(lengths[chosen].reshape(-1))
            group_feature_offsets = group_offsets[::batch]
            weights = per_sample_weights[positions] if per_sample_weights is not None else None
            pooled = self._lookup(
                g, group.features, indices[positions], group_offsets, group_feature_offsets, weights
            )
            per_feature = pooled.view(len(group.features), batch, group.dim)  # (F_g, B, D)
            for i, f in enumerate(group.features):
                blocks[f] = per_feature[i]
        return torch.cat(blocks, dim=1)  # type: ignore[arg-type]

    def _table_place(self, table: int) -> tuple[int, int]:
        """The dim group holding ``table`` and the table's first row in its flat weight."""
        g = self._group_of_table[table]
        return g, self.groups[g].table_row_offset[table]

    def split_weights(self) -> list[torch.Tensor]:
        """One (rows, dim) view per table into the flat weights (writes go through)."""
        out = []
        for t, (rows, _) in enumerate(self.tables):
            g, start = self._table_place(t)
            out.append(self.flat_weights[g][start : start + rows])
        return out

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table, its optimizer state as views: momentum1 is (rows,) or (rows, dim)."""
        out = []
        for t, (rows, _) in enumerate(self.tables):
            g, start = self._table_place(t)
            out.append({k: v[start : start + rows] for k, v in self.states[g].items()})
        return out
