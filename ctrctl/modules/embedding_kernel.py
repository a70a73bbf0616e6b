"""The interface every embedding kernel implements, declared so that mypy holds each to it.

A kernel is a table-batched embedding bag with its optimizer fused into backward: several
(rows, dim) tables looked up in one call in the TBE layout (all ids of feature 0, then feature
1, ... and ``T * B + 1`` offsets), pooled to (B, sum of feature dims). The kernels today are
FBGEMM's TBE (:class:`~ctrctl.modules.fbgemm_embedding.FbgemmTableBatchedEmbeddingBags`) and
plain torch (:class:`~ctrctl.modules.torch_embedding.TorchTableBatchedEmbeddingBags`);
:class:`~ctrctl.modules.batched_embedding.BatchedEmbeddingBag` picks one and speaks to it only
through this Protocol, so a new kernel (quantized, cached, native CPU) plugs in by providing
these members; ``batched_embedding.py`` checks each kernel class against it under mypy.

Example:
    >>> kernel: EmbeddingKernel = TorchTableBatchedEmbeddingBags(tables, fmap, optimizer)
    >>> pooled = kernel(indices, offsets)                     # (B, sum of feature dims)
    >>> kernel.split_weights()[0].shape, kernel.learning_rate
"""

from __future__ import annotations

from typing import Protocol

import torch


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
