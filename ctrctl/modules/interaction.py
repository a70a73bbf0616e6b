"""Feature interactions of DLRM: pairwise dot products, and DCNv2 low-rank cross layers.

Dot interaction on the dense embedding ``d`` (B, D) and F pooled sparse embeddings (B, F, D)::

    x = [d, e_1, ..., e_F]          (B, F + 1, D)
    z = x @ x^T                     (B, F + 1, F + 1)   every pairwise dot product
    keep z[i, j] for i < j          (B, (F + 1) F / 2)  upper triangle, no diagonal
    out = [d, kept]                 (B, D + (F + 1) F / 2)

Example:
    >>> DotInteraction(num_sparse_features=26)(torch.randn(4, 64), torch.randn(4, 26, 64)).shape
    torch.Size([4, 415])
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules.native import KERNELS, Kernel
from ctrctl.modules.native.buffers import ReusableBuffer, reusable_empty

try:
    from ctrctl.modules.native import _interaction_kernel as _ext  # type: ignore[attr-defined]
except ImportError:  # not built (no C compiler at install time): the torch path runs
    _ext = None



def native_interaction_available() -> bool:
    """Whether the C dot interaction (``_interaction_kernel.c``) was built and imports."""
    return _ext is not None


def native_interaction_isa() -> str | None:
    """The instruction set of the C interaction's loops in use (None when not built)."""
    return str(_ext.isa()) if _ext is not None else None


def use_native_interaction(kernel: str, *tensors: torch.Tensor) -> bool:
    """The C kernel takes plain float32 CPU tensors; tracing (fake or functional tensors,
    ``torch.export``, ``torch.compile``) and every other device or dtype take torch's ops."""
    return (
        kernel in ("auto", "native")
        and _ext is not None
        and not torch.compiler.is_compiling()
        and all(type(t) is torch.Tensor and t.device.type == "cpu"
                and t.dtype == torch.float32 for t in tensors)
    )


class InteractionBuffers:
    """The memory one interaction module's C kernel reuses step after step: its output and
    the two gradients (a fresh 27 MB gradient per step costs ~15 ms of page faults on the
    machines measured here; see :mod:`ctrctl.modules.native.buffers`)."""

    def __init__(self) -> None:
        self.out = ReusableBuffer()
        self.grad_sparse = ReusableBuffer()
        self.grad_dense = ReusableBuffer()

    def __deepcopy__(self, memo: dict[int, Any]) -> InteractionBuffers:
        return InteractionBuffers()  # a copy of a module starts with memory of its own


def native_pairwise_dot(dense: torch.Tensor | None, sparse: torch.Tensor, width: int,
                        buffers: InteractionBuffers | None = None) -> torch.Tensor:
    """[dense, pairwise dots, zeros] (B, width) by the C kernel, differentiable; memory
    from ``buffers`` when given."""
    out: torch.Tensor = _NativePairwiseDot.apply(dense, sparse, width, buffers)
    return out


class _NativePairwiseDot(torch.autograd.Function):
    """The dot interaction on CPU in C: [dense, pairs, zero padding] of ``width`` columns.

    ``dense`` is None for a model without dense input (the pairs of the sparse embeddings
    alone). Same output layout and pair order as :class:`_PairwiseDot`; float32 rounding
    differs (the C loops sum in another order, with FMA).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, dense: torch.Tensor | None, sparse: torch.Tensor, width: int,
        buffers: InteractionBuffers | None,
    ) -> torch.Tensor:
        assert _ext is not None
        sparse = sparse.contiguous()
        dense = dense.contiguous() if dense is not None else None
        batch, features, dim = sparse.shape
        out = reusable_empty(buffers.out if buffers else None, (batch, width), sparse)
        _ext.forward(batch, features, dim, dense.data_ptr() if dense is not None else 0,
                     sparse.data_ptr(), out.data_ptr(), width, torch.get_num_threads())
        ctx.save_for_backward(dense, sparse)
        ctx.buffers = buffers
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # a double backward raises, not silently 0
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        assert _ext is not None
        dense, sparse = ctx.saved_tensors
        buffers: InteractionBuffers | None = ctx.buffers
        grad = grad.contiguous()
        batch, features, dim = sparse.shape
        grad_sparse = reusable_empty(buffers.grad_sparse if buffers else None, sparse.shape,
                                     sparse)
        grad_dense = (reusable_empty(buffers.grad_dense if buffers else None, dense.shape,
                                     dense) if dense is not None else None)
        _ext.backward(batch, features, dim, dense.data_ptr() if dense is not None else 0,
                      sparse.data_ptr(), grad.data_ptr(), grad.size(1),
                      grad_dense.data_ptr() if grad_dense is not None else 0,
                      grad_sparse.data_ptr(), torch.get_num_threads())
        return grad_dense, grad_sparse, None, None


class _PairwiseDot(torch.autograd.Function):
    """[d, upper triangle of x x^T] for x = [d, e_1, ..., e_F], with the backward written out.

    For Z = x x^T and G = dL/dZ (zero outside the kept upper triangle), dL/dx = (G + G^T) x:
    one batched matmul in backward where autograd through ``bmm`` takes two, and the
    gradient of the sparse part comes out contiguous, as the embedding kernel wants it.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(  # type: ignore[override]
        ctx: Any, dense: torch.Tensor, sparse: torch.Tensor, pair_index: torch.Tensor, pad: int
    ) -> torch.Tensor:
        batch = dense.size(0)
        x = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (B, F + 1, D)
        n = x.size(1)
        gram = torch.bmm(x, x.transpose(1, 2))  # (B, F + 1, F + 1)
        pairs = gram.view(batch, n * n).index_select(1, pair_index)  # (B, (F + 1) F / 2)
        ctx.save_for_backward(x, pair_index)
        ctx.num_pairs = pairs.size(1)
        parts = [dense, pairs, dense.new_zeros(batch, pad)] if pad else [dense, pairs]
        return torch.cat(parts, dim=1)  # (B, D + (F + 1) F / 2 + pad)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # (B, D + (F + 1) F / 2)
        x, pair_index = ctx.saved_tensors
        batch, n, dim = x.shape
        grad_gram = grad.new_zeros(batch, n * n)
        grad_gram.index_copy_(1, pair_index, grad[:, dim : dim + ctx.num_pairs])
        grad_gram = grad_gram.view(batch, n, n)
        symmetric = grad_gram + grad_gram.transpose(1, 2)  # (B, F + 1, F + 1)
        grad_sparse = torch.bmm(symmetric[:, 1:], x)  # (B, F, D), contiguous
        grad_dense = grad[:, :dim] + torch.bmm(symmetric[:, :1], x).squeeze(1)  # (B, D)
        return grad_dense, grad_sparse, None, None


class DotInteraction(nn.Module):
    """Pairwise dot products of the dense and sparse embeddings, concatenated with dense.

    The pairs come in the order of the upper triangle of x x^T for x = [d, e_1, ..., e_F],
    row by row: d . e_1, ..., d . e_F, e_1 . e_2, ..., e_{F-1} . e_F.

    Args:
        num_sparse_features: F, the number of pooled sparse embeddings.
        pad_to: append zero columns so the width is a multiple of this. A GEMM whose inner
            size is odd runs slower: the over arch's first layer on 415 inputs takes ~1.5x
            the time of 416 on CPU (measured). The zero columns carry no information and
            their weights get zero gradient, so the model is the same.
        kernel: "auto" runs the C kernel on float32 CPU tensors where it was built (several
            times faster than torch's batched matmul on the tiny per-sample matrices) and
            torch's ops elsewhere; "native" the same, but refuses a build without the C
            kernel; "torch" always runs torch's ops (needed for second derivatives: the C
            backward is differentiable once).
    """

    def __init__(self, num_sparse_features: int, pad_to: int = 1,
                 kernel: Kernel = "auto") -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise ConfigError(f"unknown interaction kernel '{kernel}'", where="DotInteraction",
                              hint=f"use one of {', '.join(KERNELS)}")
        if kernel == "native" and _ext is None:
            raise ConfigError("the C dot interaction was not built", where="DotInteraction",
                              hint='use kernel="auto" or "torch" (or install with a C compiler)')
        self.num_sparse_features = num_sparse_features
        self.pad_to = max(1, pad_to)
        self.kernel: Kernel = kernel
        n = num_sparse_features + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        # Flat positions of the kept pairs in an (F + 1, F + 1) matrix: one gather, not two.
        self.pair_index: torch.Tensor
        self.register_buffer("pair_index", rows * n + cols, persistent=False)
        self.native_buffers = InteractionBuffers()  # the C kernel's memory, reused

    def unpadded_dim(self, dense_dim: int) -> int:
        n = self.num_sparse_features + 1
        return dense_dim + n * (n - 1) // 2

    def output_dim(self, dense_dim: int) -> int:
        width = self.unpadded_dim(dense_dim)
        return -(-width // self.pad_to) * self.pad_to

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """(B, D) dense and (B, F, D) sparse -> (B, D + (F + 1) F / 2 [+ zero padding])."""
        width = self.output_dim(dense.size(1))
        if use_native_interaction(self.kernel, dense, sparse):
            return native_pairwise_dot(dense, sparse, width, self.native_buffers)
        pad = width - self.unpadded_dim(dense.size(1))
        return _PairwiseDot.apply(dense, sparse, self.pair_index, pad)


class LowRankCrossNet(nn.Module):
    """DCNv2 cross layers with low-rank weights: x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l.

    Args:
        in_features: width of x_0.
        num_layers: number of cross layers.
        low_rank_dim: r, the rank of each U_l V_l (V_l: in -> r, U_l: r -> in).
    """

    def __init__(self, in_features: int, num_layers: int, low_rank_dim: int) -> None:
        super().__init__()
        if num_layers <= 0 or low_rank_dim <= 0:
            raise ConfigError(
                f"dcn_num_layers={num_layers} and dcn_low_rank_dim={low_rank_dim} must be positive",
                where="LowRankCrossNet",
            )
        self.V = nn.ModuleList(
            nn.Linear(in_features, low_rank_dim, bias=False) for _ in range(num_layers)
        )
        self.U = nn.ModuleList(nn.Linear(low_rank_dim, in_features) for _ in range(num_layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0  # (B, N)
        for v, u in zip(self.V, self.U, strict=True):
            x = x0 * u(v(x)) + x  # (B, N)
        return x


class DCNInteraction(nn.Module):
    """Concatenate dense and all sparse embeddings, then apply low-rank cross layers.

    Args:
        num_sparse_features: F.
        embedding_dim: D (the dense embedding has the same width).
        num_layers, low_rank_dim: see :class:`LowRankCrossNet`.
    """

    def __init__(
        self, num_sparse_features: int, embedding_dim: int, num_layers: int, low_rank_dim: int
    ) -> None:
        super().__init__()
        self.width = (num_sparse_features + 1) * embedding_dim
        self.crossnet = LowRankCrossNet(self.width, num_layers, low_rank_dim)

    def output_dim(self, dense_dim: int) -> int:
        return self.width

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = torch.cat([dense.unsqueeze(1), sparse], dim=1).flatten(1)  # (B, (F + 1) D)
        return self.crossnet(x)  # (B, (F + 1) D)
