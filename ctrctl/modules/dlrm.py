"""DLRM (Naumov et al., 2019): bottom MLP + embedding bags + interaction + top MLP -> a logit.

    dense (B, F_dense) --dense arch (MLP, ReLU)--> (B, D) ------------------+
    features (KJT, F sparse keys) --EBC--> (B, F * D) -> (B, F, D) ---------+
                                        interaction: dot (pairwise) or DCNv2 cross layers
                                                    |
                            over arch (MLP, last layer 1, no activation) -> logits (B,)

Without dense features (Avazu) there is no dense arch and the interaction sees the
embeddings alone: dot takes the pairwise dot products of the F sparse embeddings, DCN its
cross layers over their concatenation (B, F * D).

The embedding tables are trained by the optimizer fused into the EBC's backward; everything
else (``dense_parameters()``) by an ordinary torch optimizer. Loss: BCE with logits.

Example:
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(f"t_{i}", 1000, 16, [f"C{i}"])
    ...                               for i in range(3)])
    >>> model = DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[64, 16],
    ...              over_arch_layer_sizes=[64, 1])
    >>> logits = model(dense, kjt)                           # (B,)
    >>> loss = dlrm_loss(logits, labels)
    >>> opt = torch.optim.Adagrad(model.dense_parameters(), lr=0.01)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ctrctl.compat import bf16_autocast_supported
from ctrctl.errors import ConfigError
from ctrctl.modules.collision_collection import ManagedCollisionCollection
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.modules.interaction import (
    DCNInteraction,
    DotInteraction,
    InteractionBuffers,
    native_pairwise_dot,
    use_native_interaction,
)
from ctrctl.modules.mlp import MLP
from ctrctl.modules.native import Kernel
from ctrctl.sparse import KeyedJaggedTensor

Interaction = Literal["dot", "dcn"]


class SparseDotInteraction(nn.Module):
    """Pairwise dot products of F pooled sparse embeddings, for a model without dense input.

    The pairs come in the order of the upper triangle of e e^T, row by row:
    e_1 . e_2, ..., e_1 . e_F, e_2 . e_3, ..., e_{F-1} . e_F; zero columns pad the width to
    a multiple of ``pad_to`` (see :class:`DotInteraction`).

    Args:
        num_sparse_features: F (at least 2: one embedding has no pair).
        pad_to: pad the output width to a multiple of this.
        kernel: "auto" (the C kernel on float32 CPU tensors), "native" or "torch"; see
            :class:`DotInteraction`.
    """

    def __init__(self, num_sparse_features: int, pad_to: int = 1,
                 kernel: Kernel = "auto") -> None:
        super().__init__()
        if num_sparse_features < 2:
            raise ConfigError(
                f"a dot interaction without dense features needs two sparse features, got "
                f"{num_sparse_features}", where="DLRM", hint="use interaction: dcn")
        self.num_sparse_features = num_sparse_features
        self.pad_to = max(1, pad_to)
        self.kernel: Kernel = kernel
        n = num_sparse_features
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.pair_index: torch.Tensor
        self.register_buffer("pair_index", rows * n + cols, persistent=False)
        self.native_buffers = InteractionBuffers()  # the C kernel's memory, reused

    def unpadded_dim(self, embedding_dim: int) -> int:
        n = self.num_sparse_features
        return n * (n - 1) // 2

    def output_dim(self, embedding_dim: int) -> int:
        return -(-self.unpadded_dim(embedding_dim) // self.pad_to) * self.pad_to

    def forward(self, sparse: torch.Tensor) -> torch.Tensor:
        """(B, F, D) -> (B, F (F - 1) / 2 [+ zero padding])."""
        if use_native_interaction(self.kernel, sparse):
            return native_pairwise_dot(None, sparse, self.output_dim(0), self.native_buffers)
        batch, n, _ = sparse.shape
        gram = torch.bmm(sparse, sparse.transpose(1, 2))  # (B, F, F)
        pairs = gram.reshape(batch, n * n).index_select(1, self.pair_index)
        pad = self.output_dim(0) - pairs.size(1)
        return F.pad(pairs, (0, pad)) if pad else pairs


class DLRM(nn.Module):
    """The DLRM model: returns one logit per sample.

    Args:
        embedding_bag_collection: the sparse arch; every feature must have the dim D that
            the dense arch ends with.
        dense_in_features: number of dense features; 0 builds no dense arch and the
            interaction runs over the embeddings only.
        dense_arch_layer_sizes: bottom MLP widths, the last one D (ignored, may be empty,
            without dense features).
        over_arch_layer_sizes: top MLP widths, the last one 1.
        interaction: "dot" (pairwise dot products) or "dcn" (DCNv2 low-rank cross layers).
        dcn_num_layers, dcn_low_rank_dim: the cross layers when interaction="dcn".
        dense_autocast: run the dense part (MLPs, interaction) under bf16 autocast (fp32
            master weights and fp32 embeddings), on CUDA and on CPUs with AMX-BF16 or
            AVX512-BF16 (:func:`ctrctl.compat.bf16_autocast_supported`); ignored on other
            CPUs, where bf16 matmuls are emulated and slower than fp32.
        interaction_pad_to: pad the dot interaction's output with zero columns to a multiple
            of this (GEMM-friendly widths: 415 -> 416 for 26 features of dim 64); the padded
            inputs of the over arch are always zero, their weights start at zero and never
            change, so the model is the unpadded DLRM. 1 disables it.
        first_order: without dense features and with the dot interaction, a learned vector
            ``dense_anchor`` (D,) takes the dense vector's place: the model is the DLRM of a
            constant dense input, and each embedding's dot with the vector is its first-order
            term (the pairs of embeddings alone have none: a user and an item of MovieLens
            would get no bias). False: the embeddings' pairwise dots only.
        collisions: the remappers of managed-collision tables: they turn those features'
            raw keys into slots before the lookup (:mod:`ctrctl.modules.collision_collection`).
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: Sequence[int],
        over_arch_layer_sizes: Sequence[int],
        interaction: Interaction | str = "dot",
        dcn_num_layers: int = 3,
        dcn_low_rank_dim: int = 512,
        dense_autocast: bool = False,
        interaction_pad_to: int = 8,
        first_order: bool = True,
        collisions: ManagedCollisionCollection | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if dense_in_features < 0:
            raise ConfigError(f"dense_in_features={dense_in_features} must be >= 0",
                              where="DLRM")
        dims = set(embedding_bag_collection.length_per_feature())
        self.num_dense_features = dense_in_features
        if dense_in_features == 0:
            # No dense input: no dense arch, and the embeddings only need one width.
            embedding_dim = next(iter(dims)) if len(dims) == 1 else 0
            message = f"without dense features every table needs one embedding dim, got " \
                f"{sorted(dims)}"
            hint = "give every table the same embedding_dim"
        else:
            embedding_dim = dense_arch_layer_sizes[-1] if dense_arch_layer_sizes else 0
            message = f"the dense arch ends with width {embedding_dim} but embedding dims " \
                f"are {sorted(dims)}"
            hint = "make the last dense_arch_layer_sizes entry equal every table's embedding_dim"
        if not dims or dims != {embedding_dim}:
            raise ConfigError(message, where="DLRM", hint=hint)
        if not over_arch_layer_sizes or over_arch_layer_sizes[-1] != 1:
            raise ConfigError(
                f"over_arch_layer_sizes must end with 1, got {list(over_arch_layer_sizes)}",
                where="DLRM",
                hint="the last layer produces the logit",
            )
        self.num_sparse_features = len(embedding_bag_collection.feature_names())
        self.embedding_dim = embedding_dim
        self.sparse_arch = embedding_bag_collection
        self.collisions = collisions
        self.dense_arch: MLP | None = (
            MLP(dense_in_features, dense_arch_layer_sizes, dropout=dropout)
            if dense_in_features else None)
        self.interaction: DotInteraction | SparseDotInteraction | DCNInteraction
        # Without a dense vector DCN crosses the F embeddings alone: the interaction's
        # "dense" slot takes the first of them, so its input is their concatenation.
        slots = self.num_sparse_features - (0 if dense_in_features else 1)
        self.dense_anchor: nn.Parameter | None = None
        if interaction == "dot" and not dense_in_features and first_order:
            self.dense_anchor = nn.Parameter(torch.ones(embedding_dim))
        if interaction == "dot" and (dense_in_features or self.dense_anchor is not None):
            self.interaction = DotInteraction(self.num_sparse_features, pad_to=interaction_pad_to)
        elif interaction == "dot":
            self.interaction = SparseDotInteraction(self.num_sparse_features,
                                                    pad_to=interaction_pad_to)
        elif interaction == "dcn":
            self.interaction = DCNInteraction(
                slots, embedding_dim, dcn_num_layers, dcn_low_rank_dim
            )
        else:
            raise ConfigError(
                f"unknown interaction {interaction!r}", where="DLRM", hint="use dot or dcn"
            )
        self.over_arch = MLP(
            self.interaction.output_dim(embedding_dim),
            over_arch_layer_sizes,
            final_activation=False,
            dropout=dropout,
        )
        self.dense_autocast = dense_autocast
        if isinstance(self.interaction, DotInteraction | SparseDotInteraction):
            first = self.over_arch.layers[0]
            assert isinstance(first, nn.Linear)
            with torch.no_grad():
                first.weight[:, self.interaction.unpadded_dim(embedding_dim) :] = 0.0

    def forward(self, dense: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        """Logits (B,) for dense features (B, F_dense) and sparse features (a KJT of B).

        A model without dense features takes a (B, 0) ``dense`` (its batch size is read).
        """
        batch = dense.size(0)
        if self.collisions is not None:  # raw keys -> slots, before any input distribution
            features = self.collisions(features, self.sparse_arch)
        pooled = self.sparse_arch(features).values()  # (B, F * D)
        sparse = pooled.view(batch, self.num_sparse_features, self.embedding_dim)  # (B, F, D)
        autocast = (
            torch.autocast(dense.device.type, dtype=torch.bfloat16)
            if self.dense_autocast and bf16_autocast_supported(dense.device)
            else contextlib.nullcontext()
        )
        with autocast:
            if self.dense_arch is None:
                interacted = self._interact_sparse(sparse)
            else:
                embedded_dense = self.dense_arch(dense)  # (B, D)
                interacted = self.interaction(embedded_dense, sparse.to(embedded_dense.dtype))
            logits = self.over_arch(interacted)  # (B, 1)
        return logits.squeeze(1).float()  # (B,)

    def _interact_sparse(self, sparse: torch.Tensor) -> torch.Tensor:
        """The interaction of a model without dense input over (B, F, D) embeddings."""
        if self.dense_anchor is not None:  # the anchor for every sample: (B, D)
            anchor = self.dense_anchor.to(sparse.dtype).expand(sparse.size(0), -1)
            return self.interaction(anchor, sparse)  # type: ignore[call-arg]
        if isinstance(self.interaction, SparseDotInteraction):
            return self.interaction(sparse)  # (B, F (F - 1) / 2 [+ pad])
        return self.interaction(sparse[:, 0], sparse[:, 1:])  # (B, F * D)

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        """Every parameter except the embedding tables (those are updated in backward)."""
        for name, param in self.named_parameters():
            if not name.startswith("sparse_arch."):
                yield param

    def dense_named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        for name, param in self.named_parameters():
            if not name.startswith("sparse_arch."):
                yield name, param


def dlrm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of logits (B,) against 0/1 labels (B,)."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
