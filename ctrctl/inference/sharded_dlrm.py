"""The sharded serving DLRM: a trained DLRM's dense part over quantized tables split into shards.

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
    >>> model = ShardedDLRM(dlrm, shards, feature_order)
    >>> scores = model(dense, ids, lengths)                  # (B,)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules.collision_shards import ShardedRemapper
from ctrctl.modules.dlrm import DLRM, SparseDotInteraction
from ctrctl.modules.interaction import DotInteraction
from ctrctl.modules.quant_embedding import QuantEmbeddingBagCollection

DENSE_DTYPES = ("fp32", "bf16", "int8")


class ShardedDLRM(nn.Module):
    """Scores requests with quantized, sharded tables.

    Args:
        dlrm: the trained model; its dense arch, interaction and over arch are copied
            (its tables are not used).
        shards: one quantized collection per serving shard; together they hold every
            feature of ``dlrm`` once.
        dense_dtype: ``fp32``, ``bf16`` (dense layers in bfloat16) or ``int8`` (INT8 weights
            and dynamically quantized INT8 activations in the MLPs: :class:`Int8DynamicLinear`).
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
                f"{sorted(model_features)}", where="ShardedDLRM",
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
        # Managed-collision features arrive as raw keys; their read-only remaps run first.
        mc = dlrm.collisions
        managed = mc.table_features() if mc is not None else {}
        self.remap_positions = [position[f] for f in self.input_features if f in managed]
        self.remaps = nn.ModuleList(
            [cast(ShardedRemapper, mc.remappers[managed[f]]).frozen()
             for f in self.input_features if f in managed] if mc is not None else [])
        self.dense_arch: nn.Module | None = copy.deepcopy(dlrm.dense_arch)
        self.dense_anchor = copy.deepcopy(dlrm.dense_anchor)  # None, or (D,): see DLRM
        self.interaction = copy.deepcopy(dlrm.interaction)
        if isinstance(self.interaction, DotInteraction | SparseDotInteraction):
            # The exported program runs torch's ops (it loads without ctrctl): eager serving
            # runs the same ones, so the two score bitwise alike.
            self.interaction.kernel = "torch"
        self.over_arch: nn.Module = copy.deepcopy(dlrm.over_arch)
        self.compute_dtype = torch.bfloat16 if dense_dtype == "bf16" else torch.float32
        if dense_dtype == "bf16":
            for shard in shards:  # pooled straight into bfloat16: no conversion pass
                shard.set_output_dtype("bf16")
            for part in (self.dense_arch, self.interaction, self.over_arch):
                if part is not None:
                    part.to(torch.bfloat16)
            if self.dense_anchor is not None:
                self.dense_anchor.data = self.dense_anchor.data.to(torch.bfloat16)
            on_cpu = all(s.device.type == "cpu" for s in shards)
            if on_cpu and fused_linear_available():
                for part in (self.dense_arch, self.over_arch):
                    if part is not None:
                        fuse_linear_relu(part)
        elif dense_dtype == "int8":
            self.dense_arch = dense_int8(self.dense_arch) if self.dense_arch else None
            self.over_arch = dense_int8(self.over_arch)
        for param in self.parameters():  # a serving model is not trained: no autograd graph
            param.requires_grad_(False)
        self.eval()

    def forward(self, dense: torch.Tensor, ids: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        """Click probabilities (B,) for one batch in the flat layout (module docstring)."""
        return self.score_pooled(dense, self._pool(ids, lengths, dense.size(0)))

    def pool(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The sparse stage alone: pooled embeddings (B, F, D), features in input order.

        ``lengths`` is (F * B,), key-major; a bag of length 0 pools to zeros."""
        return self._pool(ids, lengths, lengths.size(0) // self.num_sparse_features)

    def _pool(self, ids: torch.Tensor, lengths: torch.Tensor, batch: int | torch.SymInt
              ) -> torch.Tensor:
        offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])  # (F * B + 1,)
        if self.remap_positions:
            ids = self._remap(ids, offsets, batch)
        pooled, start = [], 0
        for shard, size in zip(self.shards, self.shard_sizes, strict=True):
            end = start + size
            pooled.append(shard(ids, offsets[start * batch:end * batch + 1]))  # (B, D_s)
            start = end
        embedded = torch.cat(pooled, dim=1) if len(pooled) > 1 else pooled[0]  # (B, F * D)
        return embedded.view(batch, self.num_sparse_features, self.embedding_dim)

    def score_pooled(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """The dense stage alone: click probabilities (B,) from dense features (B, F_dense)
        and pooled embeddings (B, F, D) in input order (:meth:`pool`)."""
        batch = dense.size(0)
        if not self.identity_order:
            sparse = sparse.index_select(1, self.feature_perm)  # (B, F, D), model order
        sparse = sparse.to(self.compute_dtype)
        if self.dense_arch is None and self.dense_anchor is None:
            if isinstance(self.interaction, SparseDotInteraction):
                interacted = self.interaction(sparse)
            else:
                interacted = self.interaction(sparse[:, 0], sparse[:, 1:])
        else:
            if self.dense_arch is None:  # the learned vector in the dense vector's place
                assert self.dense_anchor is not None
                embedded_dense = self.dense_anchor.expand(batch, -1)  # (B, D)
            else:
                embedded_dense = self.dense_arch(dense.to(self.compute_dtype))  # (B, D)
            if self.compute_dtype == torch.bfloat16 and isinstance(self.interaction,
                                                                   DotInteraction):
                interacted = bf16_dot_interaction(self.interaction, embedded_dense, sparse)
            else:
                interacted = self.interaction(embedded_dense, sparse)
        logits = self.over_arch(interacted).squeeze(1)  # (B,)
        return torch.sigmoid(logits.float())

    def _remap(self, ids: torch.Tensor, offsets: torch.Tensor, batch: int | torch.SymInt
               ) -> torch.Tensor:
        """Managed-collision features' raw keys -> slots (read-only; unknown -> row 0)."""
        position = torch.arange(ids.numel(), device=ids.device)  # (N,)
        for feature, remap in zip(self.remap_positions, self.remaps, strict=True):
            inside = (position >= offsets[feature * batch]) & (
                position < offsets[(feature + 1) * batch])
            ids = torch.where(inside, remap(ids), ids)
        return ids

    def table_bytes(self) -> dict[str, int]:
        """Bytes of every quantized table."""
        out: dict[str, int] = {}
        for shard in self.shards:
            assert isinstance(shard, QuantEmbeddingBagCollection)
            out.update(shard.nbytes())
        return out


def bf16_dot_interaction(interaction: DotInteraction, dense: torch.Tensor,
                         sparse: torch.Tensor) -> torch.Tensor:
    """:class:`DotInteraction`'s forward for bfloat16 inputs, in inference.

    The Gram matrix is a bfloat16 batched matmul (faster than fp32 on CPUs with AMX or
    AVX512-BF16), but the pairs are gathered from it in fp32: a gather of 2-byte elements is
    not vectorized on CPU and takes ~4x the fp32 one at (512, 729) -> (512, 351).

    Args:
        interaction: the trained interaction (its pair order and padding).
        dense: (B, D) bfloat16, the dense arch's output.
        sparse: (B, F, D) bfloat16 pooled embeddings.

    Returns:
        (B, D + (F + 1) F / 2 + padding) bfloat16, as the interaction's own forward.
    """
    batch = dense.size(0)
    x = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (B, F + 1, D)
    n = x.size(1)
    gram = torch.bmm(x, x.transpose(1, 2)).view(batch, n * n)  # (B, (F + 1)^2)
    pairs = gram.float().index_select(1, interaction.pair_index).to(dense.dtype)
    pad = interaction.output_dim(dense.size(1)) - interaction.unpadded_dim(dense.size(1))
    parts = [dense, pairs, dense.new_zeros(batch, pad)] if pad else [dense, pairs]
    return torch.cat(parts, dim=1)


class FusedLinear(nn.Module):
    """A bfloat16 Linear layer, and the ReLU after it if any, as one oneDNN call on the CPU.

    ``torch.ops.mkldnn._linear_pointwise`` applies the bias and the ReLU inside the GEMM:
    no copy of the bias into the output before it, and no second pass over the output for
    the ReLU (a bfloat16 ReLU of 512 x 512 takes about 40 us here, a third of the GEMM). The
    op is torch's own (the one TorchInductor emits for CPU linear layers), so an exported
    program that calls it still needs nothing but torch; it has no CUDA kernel, and
    :class:`ShardedDLRM` uses it only for CPU shards. At a request of 512 candidates the
    six layers of the benchmark's DLRM take about 0.3 ms less this way.

    Args:
        linear: the layer (its weight and bias are copied).
        relu: apply ReLU to the output.
    """

    def __init__(self, linear: nn.Linear, relu: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().clone(), requires_grad=False)
        self.bias = (nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
                     if linear.bias is not None else None)
        self.activation = "relu" if relu else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (ReLU takes no scalar; an empty list would not serialize with torch.export.save)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias,
                                                  self.activation, [0.0], "")


def fused_linear_available() -> bool:
    """Whether this torch has oneDNN's fused bfloat16 linear (:class:`FusedLinear`)."""
    mkldnn = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_linear_pointwise")
            and bool(mkldnn._is_mkldnn_bf16_supported()))


def fuse_linear_relu(module: nn.Module) -> nn.Module:
    """Every ``Linear`` (+ ``ReLU``) in ``module``'s ``Sequential`` s as a :class:`FusedLinear`.

    In place; the fused layers keep the Linear's place in the ``Sequential``, each ReLU
    they absorb is dropped.
    """
    for name, child in module.named_children():
        if isinstance(child, nn.Sequential):
            layers: list[nn.Module] = []
            items = list(child)
            i = 0
            while i < len(items):
                layer = items[i]
                if isinstance(layer, nn.Linear):
                    relu = i + 1 < len(items) and isinstance(items[i + 1], nn.ReLU)
                    layers.append(FusedLinear(layer, relu))
                    i += 2 if relu else 1
                else:
                    layers.append(fuse_linear_relu(layer))
                    i += 1
            setattr(module, name, nn.Sequential(*layers))
        else:
            fuse_linear_relu(child)
    return module


class Int8DynamicLinear(nn.Module):
    """A Linear layer with INT8 weights and INT8 activations quantized at run time.

    Weights: symmetric, one scale per output channel. Activations: symmetric, one scale per
    row, computed for every call ("dynamic"). The product accumulates in int32
    (``torch._int_mm``, an aten op, so the layer exports)::

        y = (q(x) @ W_q^T) * s_x * s_w + b        q(x) = round(x / s_x), s_x = max|x| / 127

    Args:
        linear: the FP32 layer to convert.
    """

    weight_int8: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # (out, in)
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (out,)
        q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", q.t().contiguous())  # (in, out)
        self.register_buffer("weight_scale", scale)
        bias = linear.bias.detach().float() if linear.bias is not None else \
            torch.zeros(weight.shape[0])
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0  # (B, 1)
        q = torch.round(x / scale).clamp(-127, 127).to(torch.int8)  # (B, in)
        acc = torch._int_mm(q, self.weight_int8)  # (B, out) int32
        return acc.float() * scale * self.weight_scale + self.bias


def dense_int8(module: nn.Module) -> nn.Module:
    """``module`` with every Linear layer replaced by an :class:`Int8DynamicLinear` (in place)."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8DynamicLinear(child))
        else:
            dense_int8(child)
    return module
