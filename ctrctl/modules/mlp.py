"""Multi-layer perceptrons for the dense parts of a CTR model.

Example:
    >>> mlp = MLP(13, [512, 256, 64])            # Linear + ReLU per layer
    >>> mlp(torch.randn(8, 13)).shape            # torch.Size([8, 64])
    >>> head = MLP(64, [256, 1], final_activation=False)

On CPUs where torch's float32 matmul is the slower one (AMD's: measured on a Zen 3 EPYC,
MKL's sgemm reaches about half the core's FMA peak; on a Zen 5 EPYC it runs AVX2 code at
under half the AVX-512 peak, and this GEMM's AVX-512 build is twice as fast), the layers run on ctrctl's own GEMM
(``_dense_kernel.c``) with the bias and the ReLU fused into it, forward and backward;
elsewhere, and for bf16 autocast, tracing and export, they are torch's ``nn.Linear`` and
``nn.ReLU``. The parameters and the state dict are the same either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules.native import KERNELS, Kernel
from ctrctl.modules.native.buffers import ReusableBuffer, reusable_empty

try:
    from ctrctl.modules.native import _dense_kernel as _ext  # type: ignore[attr-defined]
except ImportError:  # not built (no C compiler at install time): torch's layers run
    _ext = None


#: Layers narrower than this run on torch: a GEMM tile is 24 or 32 columns wide, and a
#: layer of one output (the logit) is a matrix-vector product.
NATIVE_MIN_WIDTH = 24
#: With ``kernel="auto"``, layers of fewer multiply-adds per call (batch x in x out) than
#: this run on torch: below it the autograd function's Python costs more than the GEMM
#: saves (measured: a 1024 x 128 x 64 layer 10% slower on the C GEMM; bench_train's
#: layers are 27-870 M).
NATIVE_MIN_WORK = 1 << 24

_PARAMETER_TYPES = (torch.Tensor, nn.Parameter)


def native_dense_available() -> bool:
    """Whether the C GEMM (``_dense_kernel.c``) was built and imports."""
    return _ext is not None


def native_dense_isa() -> str | None:
    """The instruction set of the C GEMM's loops in use (None when not built)."""
    return str(_ext.isa()) if _ext is not None else None


def native_dense_preferred() -> bool:
    """Whether ``kernel="auto"`` runs the C GEMM on this CPU: built, and an AMD CPU with
    AVX2 and FMA (where it measured faster than torch's matmul; on Intel's, MKL is)."""
    return _ext is not None and bool(_ext.preferred())


def _native_usable(kernel: str, x: torch.Tensor) -> bool:
    if kernel == "torch" or _ext is None or (kernel == "auto" and not _PREFERRED):
        return False
    return (
        type(x) is torch.Tensor
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 2
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled("cpu")
    )


_PREFERRED = native_dense_preferred()


class LayerBuffers:
    """The memory one layer's C GEMM reuses step after step: its output and its input's
    gradient (a fresh 8 MB tensor per step costs page faults; see
    :mod:`ctrctl.modules.native.buffers`)."""

    def __init__(self) -> None:
        self.out = ReusableBuffer()
        self.grad_input = ReusableBuffer()

    def __deepcopy__(self, memo: dict[int, Any]) -> LayerBuffers:
        return LayerBuffers()  # a copy of a module starts with memory of its own


def _gemm(rows: int, cols: int, inner: int, a: torch.Tensor, a_strides: tuple[int, int],
          b: torch.Tensor, b_strides: tuple[int, int], out: torch.Tensor, *,
          mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
          relu: bool = False, row_sums: torch.Tensor | None = None) -> None:
    assert _ext is not None
    _ext.gemm(rows, cols, inner, a.data_ptr(), *a_strides,
              mask.data_ptr() if mask is not None else 0, b.data_ptr(), *b_strides,
              out.data_ptr(), bias.data_ptr() if bias is not None else 0, int(relu),
              row_sums.data_ptr() if row_sums is not None else 0, torch.get_num_threads())


class _NativeLinear(torch.autograd.Function):
    """``relu(x W^T + b)`` (or without the ReLU) on the C GEMM, float32, CPU.

    Backward masks the output gradient by the ReLU inside the GEMM's packing (no masked
    copy), and sums the bias gradient while packing it. Float32 rounding differs from
    torch's (another summation order, with FMA).
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
        relu: bool, buffers: LayerBuffers,
    ) -> torch.Tensor:
        x = x.contiguous()
        weight = weight.contiguous()
        bias = bias.contiguous() if bias is not None else None
        rows, n_in = x.shape
        n_out = weight.size(0)
        out = reusable_empty(buffers.out, (rows, n_out), x)
        # B(k, j) = W[j, k]: W^T without a copy.
        _gemm(rows, n_out, n_in, x, (n_in, 1), weight, (1, n_in), out, bias=bias, relu=relu)
        ctx.save_for_backward(x, weight, out if relu else None)
        ctx.has_bias = bias is not None
        ctx.buffers = buffers
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # a double backward raises, not silently 0
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight, out = ctx.saved_tensors
        grad = grad.contiguous()
        rows, n_in = x.shape
        n_out = weight.size(0)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:  # dx = g W
            grad_x = reusable_empty(ctx.buffers.grad_input, (rows, n_in), x)
            _gemm(rows, n_in, n_out, grad, (n_out, 1), weight, (n_in, 1), grad_x, mask=out)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            # dW = g^T x, and db = the column sums of g while it is packed
            grad_w = x.new_empty(n_out, n_in)
            grad_b = x.new_zeros(n_out) if ctx.has_bias else None
            _gemm(n_out, n_in, rows, grad, (1, n_out), x, (n_in, 1), grad_w, mask=out,
                  row_sums=grad_b)
        return grad_x, grad_w, grad_b, None, None


class MLP(nn.Module):
    """Linear layers with ReLU between them (and after the last one unless told not to).

    Args:
        in_features: input width.
        layer_sizes: output width of each layer.
        final_activation: apply ReLU after the last layer too (True for a bottom MLP,
            False for a head that produces logits).
        kernel: "auto" runs the layers on the C GEMM where it is the faster one
            (:func:`native_dense_preferred`) for float32 CPU input and layers of at least
            ``NATIVE_MIN_WORK`` multiply-adds a call, torch's layers elsewhere; "native"
            runs the C GEMM wherever it can (float32 CPU tensors, no autocast, no tracing,
            layers at least ``NATIVE_MIN_WIDTH`` wide); "torch" always runs torch's
            layers.
        dropout: in training, the share of each hidden layer's outputs zeroed at random
            (after its ReLU, not after the last layer); training with dropout runs torch's
            layers. Evaluation, tracing and export see no dropout.
    """

    def __init__(
        self, in_features: int, layer_sizes: Sequence[int], final_activation: bool = True,
        kernel: Kernel = "auto", dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not layer_sizes or any(size <= 0 for size in layer_sizes) or in_features <= 0:
            raise ConfigError(
                f"MLP sizes must be positive, got in_features={in_features}, "
                f"layer_sizes={list(layer_sizes)}",
                where="MLP",
            )
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"MLP dropout must be in [0, 1), got {dropout}", where="MLP")
        if kernel not in KERNELS:
            raise ConfigError(f"unknown dense kernel '{kernel}'", where="MLP",
                              hint=f"use one of {', '.join(KERNELS)}")
        layers: list[nn.Module] = []
        widths = [in_features, *layer_sizes]
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            layers.append(nn.Linear(n_in, n_out))
            if final_activation or i < len(layer_sizes) - 1:
                # In place: the Linear output is not needed by its backward, only the ReLU output.
                layers.append(nn.ReLU(inplace=True))
        self.layers = nn.Sequential(*layers)
        self.out_features = widths[-1]
        self.kernel: Kernel = kernel
        self.dropout = dropout
        self.native_buffers = [LayerBuffers() for _ in layer_sizes]  # the C GEMM's memory

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout and self.training:
            return self._forward_dropout(x)
        if not _native_usable(self.kernel, x):
            return self.layers(x)  # (B, in) -> (B, out)
        modules = list(self.layers)
        layer = 0
        i = 0
        while i < len(modules):
            linear = modules[i]
            relu = i + 1 < len(modules) and type(modules[i + 1]) is nn.ReLU
            if (type(linear) is nn.Linear and type(linear.weight) in _PARAMETER_TYPES
                    and linear.weight.dtype == torch.float32
                    and linear.out_features >= NATIVE_MIN_WIDTH
                    and (self.kernel == "native"
                         or x.size(0) * linear.in_features * linear.out_features
                         >= NATIVE_MIN_WORK)):
                x = _NativeLinear.apply(x, linear.weight, linear.bias, relu,
                                        self.native_buffers[layer])
            else:  # a narrow layer (the logit), or one replaced (quantized): its own forward
                x = linear(x)
                if relu:
                    x = torch.relu(x)
            i += 2 if relu else 1
            layer += 1
        return x

    def _forward_dropout(self, x: torch.Tensor) -> torch.Tensor:
        """Torch's layers, each hidden layer's activations dropped out (training only)."""
        modules = list(self.layers)
        for i, module in enumerate(modules):
            x = module(x)
            if type(module) is nn.ReLU and i + 1 < len(modules):
                x = nn.functional.dropout(x, self.dropout, training=True)
        return x
