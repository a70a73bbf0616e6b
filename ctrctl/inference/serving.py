"""The serving model: a trained DLRM's dense part over quantized tables split into shards.

Inputs are flat, as a request arrives (no jagged-tensor classes, so an exported program
needs nothing but torch and fbgemm_gpu)::

    dense    (B, F_dense) float32          transformed dense features
    ids      (N,) int64                    every feature's ids, feature after feature in
                                           the input order (``input_features``), key-major
    lengths  (F * B,) int64                ids per (feature, sample), key-major
    ->       (B,) float32                  click probabilities

The input order is shard-major: shard 0's features, then shard 1's, ... so each shard's
bags are one contiguous run of the offsets and a shard reads its slice of them
(``offsets[s * B : e * B + 1]``) without moving any id. The pooled vectors are put back in
the trained model's feature order before the interaction, so one shard or several give
the same bytes to the same dense layers: sharded scores equal unsharded ones bitwise.

Example:
    >>> model = ServingModel(dlrm, shards, feature_order)
    >>> scores = model(dense, ids, lengths)                  # (B,)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules.dlrm import DLRM, SparseDotInteraction
from ctrctl.modules.quant_embedding import QuantEmbeddingBagCollection

DENSE_DTYPES = ("fp32", "bf16", "int8")


class ServingModel(nn.Module):
    """Scores requests with quantized, sharded tables.

    Args:
        dlrm: the trained model; its dense arch, interaction and over arch are copied
            (its tables are not used).
        shards: one quantized collection per serving shard; together they hold every
            feature of ``dlrm`` once.
        dense_dtype: ``fp32``, ``bf16`` (dense layers in bfloat16) or ``int8`` (dynamic
            INT8 quantization of the Linear layers, eager only: see :func:`dense_int8`).
    """

    feature_perm: torch.Tensor

    def __init__(self, dlrm: DLRM, shards: Sequence[QuantEmbeddingBagCollection],
                 dense_dtype: str = "fp32") -> None:
        super().__init__()
        if dense_dtype not in DENSE_DTYPES:
            raise ConfigError(f"unknown dense dtype {dense_dtype!r}",
                              hint=f"use one of {', '.join(DENSE_DTYPES)}")
        model_features = dlrm.sparse_arch.feature_names()
        self.input_features = [f for s in shards for f in s.feature_names()]
        if sorted(self.input_features) != sorted(model_features):
            raise ConfigError(
                f"the shards hold features {sorted(self.input_features)} but the model has "
                f"{sorted(model_features)}", where="ServingModel",
                hint="place every table of the model on exactly one shard")
        self.num_dense_features = dlrm.num_dense_features
        self.num_sparse_features = dlrm.num_sparse_features
        self.embedding_dim = dlrm.embedding_dim
        self.dense_dtype = dense_dtype
        self.shards = nn.ModuleList(shards)
        self.shard_sizes = [len(s.feature_names()) for s in shards]
        position = {f: i for i, f in enumerate(self.input_features)}
        self.register_buffer("feature_perm", torch.tensor(
            [position[f] for f in model_features], dtype=torch.int64), persistent=False)
        self.identity_order = self.input_features == model_features
        self.dense_arch: nn.Module | None = copy.deepcopy(dlrm.dense_arch)
        self.interaction = copy.deepcopy(dlrm.interaction)
        self.over_arch: nn.Module = copy.deepcopy(dlrm.over_arch)
        self.compute_dtype = torch.bfloat16 if dense_dtype == "bf16" else torch.float32
        if dense_dtype == "bf16":
            for part in (self.dense_arch, self.interaction, self.over_arch):
                if part is not None:
                    part.to(torch.bfloat16)
        elif dense_dtype == "int8":
            self.dense_arch = dense_int8(self.dense_arch) if self.dense_arch else None
            self.over_arch = dense_int8(self.over_arch)
        self.eval()

    def forward(self, dense: torch.Tensor, ids: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        """Click probabilities (B,) for one batch in the flat layout (module docstring)."""
        batch = dense.size(0)
        offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])  # (F * B + 1,)
        pooled, start = [], 0
        for shard, size in zip(self.shards, self.shard_sizes, strict=True):
            end = start + size
            pooled.append(shard(ids, offsets[start * batch:end * batch + 1]))  # (B, D_s)
            start = end
        embedded = torch.cat(pooled, dim=1) if len(pooled) > 1 else pooled[0]  # (B, F * D)
        sparse = embedded.view(batch, self.num_sparse_features, self.embedding_dim)
        if not self.identity_order:
            sparse = sparse.index_select(1, self.feature_perm)  # (B, F, D), model order
        sparse = sparse.to(self.compute_dtype)
        if self.dense_arch is None:
            if isinstance(self.interaction, SparseDotInteraction):
                interacted = self.interaction(sparse)
            else:
                interacted = self.interaction(sparse[:, 0], sparse[:, 1:])
        else:
            embedded_dense = self.dense_arch(dense.to(self.compute_dtype))  # (B, D)
            interacted = self.interaction(embedded_dense, sparse)
        logits = self.over_arch(interacted).squeeze(1)  # (B,)
        return torch.sigmoid(logits.float())

    def table_bytes(self) -> dict[str, int]:
        """Bytes of every quantized table."""
        out: dict[str, int] = {}
        for shard in self.shards:
            assert isinstance(shard, QuantEmbeddingBagCollection)
            out.update(shard.nbytes())
        return out


def dense_int8(module: nn.Module) -> nn.Module:
    """The module with its Linear layers dynamically quantized to INT8 (torch's CPU kernels).

    torch's dynamic quantization packs weights into opaque objects that ``torch.export``
    cannot write without pickling them, so an INT8 dense part is for eager serving; the
    exported artifact refuses it (see :mod:`ctrctl.inference.export`).
    """
    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(module, {nn.Linear}, dtype=torch.qint8)
