"""Optimizers from the pipeline config: the fused embedding one and the dense one.

Embeddings are updated inside the backward pass by the table-batched kernel (a fused
optimizer, no gradient tensors for the tables); the MLPs and interaction layers by a plain
``torch.optim`` optimizer over ``model.dense_parameters()``.

Example:
    >>> fused = embedding_optimizer(cfg.embedding_optimizer)     # for EmbeddingBagCollection
    >>> dense = dense_optimizer(model.dense_parameters(), cfg.dense_optimizer)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ctrctl.config import DenseOptimizerConfig

# The embedding one is the model's (it is built with its tables): re-exported from there.
from ctrctl.models.build import EMBEDDING_KINDS, embedding_optimizer

__all__ = ["EMBEDDING_KINDS", "dense_optimizer", "embedding_optimizer"]


def dense_optimizer(
    params: Iterable[torch.nn.Parameter], section: DenseOptimizerConfig
) -> torch.optim.Optimizer:
    """A torch optimizer over the dense parameters.

    Args:
        params: the parameters (``model.dense_parameters()``).
        section: kind, lr, eps, weight_decay, momentum.
    """
    params = list(params)
    if section.kind == "adagrad":
        return torch.optim.Adagrad(params, lr=section.lr, eps=section.eps,
                                   weight_decay=section.weight_decay)
    if section.kind == "adam":
        return torch.optim.Adam(params, lr=section.lr, eps=section.eps,
                                weight_decay=section.weight_decay)
    return torch.optim.SGD(params, lr=section.lr, momentum=section.momentum,
                           weight_decay=section.weight_decay)
