"""The interface every embedding kernel implements, declared so that mypy holds each to it.

A kernel is a table-batched embedding bag with its optimizer fused into backward: several
(rows, dim) tables looked up in one call in the TBE layout (all ids of feature 0, then feature
1, ... and ``T * B + 1`` offsets), pooled to (B, sum of feature dims). The kernels today are
FBGEMM's TBE (:class:`~ctrctl.modules.fbgemm_embedding.FbgemmTableBatchedEmbeddingBags`) and
plain torch (:class:`~ctrctl.modules.torch_embedding.TorchTableBatchedEmbeddingBags`);
:class:`~ctrctl.modules.batched_embedding.BatchedEmbeddingBag` picks one and speaks to it only
through this Protocol, so a new kernel (quantized, cached, native CPU) plugs in by providing
these members; ``batched_embedding.py`` checks each kernel class against it under mypy.
The checks every kernel shares (tables, offsets, loading weights and state) live here too.

Example:
    >>> kernel: EmbeddingKernel = TorchTableBatchedEmbeddingBags(tables, fmap, optimizer)
    >>> pooled = kernel(indices, offsets)                     # (B, sum of feature dims)
    >>> kernel.split_weights()[0].shape, kernel.learning_rate
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from ctrctl.errors import CheckpointError, ConfigError, SparseInputError


class EmbeddingKernel(Protocol):
    """A table-batched embedding bag with a fused optimizer (see the module docstring)."""

    def __call__(self, indices: torch.Tensor, offsets: torch.Tensor,
                 per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        """Pool ids (TBE layout) into (B, sum of feature dims); backward updates the rows."""
        ...

    def split_weights(self) -> list[torch.Tensor]:
        """One (rows, dim) view per table (writes go through to the kernel's storage)."""
        ...

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table, its optimizer state as views, named as FBGEMM names them."""
        ...

    def set_learning_rate(self, lr: float) -> None:
        """Change the fused optimizer's learning rate (a scheduler's step)."""
        ...

    @property
    def learning_rate(self) -> float:
        """The fused optimizer's current learning rate."""
        ...


def table_layout(
    tables: Sequence[tuple[int, int]], feature_table_map: Sequence[int] | None, where: str
) -> tuple[list[tuple[int, int]], list[int]]:
    """The (rows, dim) tables and the table of each feature, checked.

    Args:
        tables: (rows, dim) per table; at least one.
        feature_table_map: the table each feature looks up (None: feature i -> table i).
        where: the class named in the error.

    Example:
        >>> table_layout([(10, 4)], [0, 0], "BatchedEmbeddingBag")    # ([(10, 4)], [0, 0])
    """
    checked = [(int(r), int(d)) for r, d in tables]
    if not checked:
        raise ConfigError("no tables", where=where, hint="give at least one")
    features = list(feature_table_map if feature_table_map is not None else range(len(checked)))
    bad = [t for t in features if not 0 <= t < len(checked)]
    if bad:
        raise ConfigError(
            f"feature_table_map names tables {bad} but there are {len(checked)}", where=where
        )
    return checked, features


def batch_of(offsets: torch.Tensor, num_features: int, where: str) -> int:
    """The batch size B of ``T * B + 1`` offsets for ``num_features`` = T features."""
    if (offsets.numel() - 1) % num_features:
        raise SparseInputError(
            f"{offsets.numel()} offsets do not split into {num_features} features of equal batch",
            where=where,
            hint="pass T * B + 1 offsets",
        )
    return (offsets.numel() - 1) // num_features


@torch.no_grad()
def copy_weights(
    targets: Sequence[torch.Tensor], weights: Sequence[torch.Tensor], where: str
) -> None:
    """Copy one (rows, dim) tensor per table into ``targets`` (a kernel's weight views)."""
    if len(weights) != len(targets):
        raise CheckpointError(f"{len(weights)} weights for {len(targets)} tables", where=where)
    for t, (target, source) in enumerate(zip(targets, weights, strict=True)):
        if tuple(source.shape) != tuple(target.shape):
            raise CheckpointError(
                f"table {t}: weight of shape {tuple(source.shape)} does not fit "
                f"{tuple(target.shape)}",
                where=f"{where}.load_weights",
                hint="load a checkpoint made with the same table sizes",
            )
        target.copy_(source)


@torch.no_grad()
def copy_optimizer_states(
    targets: Sequence[dict[str, torch.Tensor]],
    states: Sequence[dict[str, torch.Tensor]],
    where: str,
) -> None:
    """Copy per-table optimizer state into ``targets`` (a kernel's state views), reshaped."""
    if len(states) != len(targets):
        raise CheckpointError(
            f"{len(states)} optimizer states for {len(targets)} tables", where=where
        )
    for t, (target, source) in enumerate(zip(targets, states, strict=True)):
        if set(target) != set(source):
            raise CheckpointError(
                f"table {t}: optimizer state has {sorted(source)}, expected {sorted(target)}",
                where=f"{where}.load_optimizer_state",
                hint="resume with the same embedding optimizer",
            )
        for name, tensor in target.items():
            if tensor.numel() != source[name].numel():
                raise CheckpointError(
                    f"table {t}: {name} has {source[name].numel()} entries, "
                    f"expected {tensor.numel()}",
                    where=f"{where}.load_optimizer_state",
                )
            tensor.copy_(source[name].reshape(tensor.shape))
