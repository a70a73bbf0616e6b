"""The C GEMM of the MLPs against an independent float64 reference, and where it runs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules import mlp as mlp_module
from ctrctl.modules.mlp import MLP, native_dense_available

pytestmark = pytest.mark.skipif(not native_dense_available(),
                                reason="the C dense kernel was not built")

LOOPS = ("avx512f", "avx2", "base")


@pytest.fixture(params=LOOPS)
def loops(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Each build of the GEMM this CPU runs, the widest restored after."""
    ext = mlp_module._ext
    assert ext is not None
    before = ext.isa()
    if not ext.use(request.param):
        pytest.skip(f"this CPU does not run the {request.param} loops")
    yield request.param
    for name in LOOPS:  # back to the widest this CPU runs
        if ext.use(name):
            break
    assert ext.isa() == before


def gemm(a: torch.Tensor, b: torch.Tensor, *, mask: torch.Tensor | None = None,
         bias: torch.Tensor | None = None, relu: bool = False,
         row_sums: torch.Tensor | None = None, threads: int = 1) -> torch.Tensor:
    """C = mask(A) B [+ bias, ReLU] by the kernel, for A and B of any strides."""
    ext = mlp_module._ext
    assert ext is not None
    rows, inner = a.shape
    cols = b.size(1)
    if mask is not None:
        assert mask.stride() == a.stride()
    c = torch.full((rows, cols), float("nan"))  # every entry must be written
    ext.gemm(rows, cols, inner, a.data_ptr(), a.stride(0), a.stride(1),
             mask.data_ptr() if mask is not None else 0, b.data_ptr(), b.stride(0),
             b.stride(1), c.data_ptr(), bias.data_ptr() if bias is not None else 0, int(relu),
             row_sums.data_ptr() if row_sums is not None else 0, threads)
    return c


def layout(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values with rows contiguous, columns contiguous, or neither."""
    if kind == "rows":
        return x.contiguous()
    if kind == "columns":
        return x.t().contiguous().t()
    wide = torch.zeros(x.size(0), 2 * x.size(1) + 1)
    wide[:, 1::2] = x
    return wide[:, 1::2]  # column stride 2


SHAPES = [
    (1, 1, 1),
    (7, 5, 3),          # smaller than one tile
    (4, 24, 256),       # exactly one tile (AVX2's, baseline's) and one inner block
    (8, 32, 256),       # exactly one tile of the AVX-512 build
    (130, 50, 257),     # past a block of rows, a tile of columns and an inner block
    (61, 415, 513),
    (300, 13, 40),      # a first layer's width
    (37, 70, 1100),     # inner dimension longer than C is tall: threads split it
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_equals_the_float64_product(loops: str, shape: tuple[int, int, int],
                                         threads: int) -> None:
    rows, cols, inner = shape
    gen = torch.Generator().manual_seed(rows * 1000 + cols + inner)
    a = torch.randn(rows, inner, generator=gen) / max(inner, 1) ** 0.5  # C of unit scale
    b = torch.randn(inner, cols, generator=gen)
    expected = (a.double() @ b.double()).float()
    for a_kind in ("rows", "columns", "strided"):
        for b_kind in ("rows", "columns"):
            got = gemm(layout(a, a_kind), layout(b, b_kind), threads=threads)
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mask_and_row_sums_are_the_relu_backward_and_the_bias_gradient(
        loops: str, shape: tuple[int, int, int], threads: int) -> None:
    rows, cols, inner = shape
    gen = torch.Generator().manual_seed(7 + rows + cols * inner)
    a = torch.randn(rows, inner, generator=gen) / max(inner, 1) ** 0.5
    mask = torch.randn(rows, inner, generator=gen)
    mask[0, 0] = float("nan")  # NaN outputs pass no gradient, as torch's ReLU backward
    b = torch.randn(inner, cols, generator=gen)
    masked = torch.where(mask > 0, a, 0.0).double()
    for kind in ("rows", "columns"):
        sums = torch.zeros(rows)
        got = gemm(layout(a, kind), b, mask=layout(mask, kind), row_sums=sums, threads=threads)
        torch.testing.assert_close(got, (masked @ b.double()).float())
        torch.testing.assert_close(sums, masked.sum(1).float())


@pytest.mark.parametrize("threads", [1, 2])
def test_bias_and_relu_are_fused_into_the_last_block(loops: str, threads: int) -> None:
    gen = torch.Generator().manual_seed(3)
    for rows, cols, inner in [(130, 50, 257), (9, 30, 0), (5, 3, 2)]:
        a = torch.randn(rows, inner, generator=gen) / max(inner, 1) ** 0.5
        b = torch.randn(inner, cols, generator=gen)
        bias = torch.randn(cols, generator=gen)
        plain = a.double() @ b.double() + bias.double()
        torch.testing.assert_close(gemm(a, b, bias=bias, threads=threads), plain.float())
        torch.testing.assert_close(gemm(a, b, bias=bias, relu=True, threads=threads),
                                   plain.clamp_min(0).float())


def test_relu_keeps_nan_as_torch_does(loops: str) -> None:
    a = torch.ones(8, 4)
    a[3, 1] = float("nan")
    out = gemm(a, torch.ones(4, 30), relu=True)
    assert out[3].isnan().all() and not out[[0, 1, 2, 4, 5, 6, 7]].isnan().any()


def test_bad_sizes_raise() -> None:
    ext = mlp_module._ext
    assert ext is not None
    with pytest.raises(ValueError, match="negative sizes"):
        ext.gemm(-1, 2, 2, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1)
    with pytest.raises(ValueError, match="no loops named"):
        ext.use("sse9")


# ---- the MLP on the kernel -------------------------------------------------------------


def run(mlp: nn.Module, x: torch.Tensor, grad_x: bool) -> tuple[torch.Tensor, ...]:
    """Output, input gradient and parameter gradients of sum(out * weights)."""
    x = x.clone().requires_grad_(grad_x)
    out = mlp(x)
    # Weights of unit total size: gradients of unit scale, where float32's default
    # tolerances (relative 1.3e-6, absolute 1e-5) are the ones that apply.
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out) / out.size(0)
    (out * weights).sum().backward()
    grads = [p.grad for p in mlp.parameters()]
    return (out.detach(), x.grad if grad_x else torch.zeros(0), *grads)  # type: ignore[misc]


@pytest.mark.parametrize("final_activation", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_mlp_on_the_kernel_equals_the_float64_mlp(loops: str, final_activation: bool,
                                                  threads: int) -> None:
    torch.manual_seed(0)
    sizes = [512, 256, 64] if final_activation else [96, 48, 1]
    native = MLP(13, sizes, final_activation=final_activation, kernel="native")
    reference = copy.deepcopy(native).double()
    x = torch.randn(300, 13)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for grad_x in (False, True):  # the first layer's input gradient skipped, then asked
            native.zero_grad(set_to_none=True)
            reference.zero_grad(set_to_none=True)
            got = run(native, x, grad_x)
            expected = run(reference, x.double(), grad_x)
            for g, e in zip(got, expected, strict=True):
                torch.testing.assert_close(g, e.float())
    finally:
        torch.set_num_threads(before)


def test_the_kernel_runs_where_asked_and_torch_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    ext = mlp_module._ext
    real = ext.gemm  # type: ignore[union-attr]

    class Counting:
        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(ext, name)

        def gemm(self, *args: object) -> None:
            calls.append(args[:3])
            real(*args)

    monkeypatch.setattr(mlp_module, "_ext", Counting())
    mlp = MLP(16, [32, 1], final_activation=False, kernel="native")
    x = torch.randn(8, 16, requires_grad=True)
    mlp(x).sum().backward()
    # The 32-wide layer forward, then its dx and dW; the logit layer (1 wide) is torch's.
    assert calls == [(8, 32, 16), (8, 16, 32), (32, 16, 8)]

    calls.clear()
    MLP(16, [32, 1], kernel="torch")(x)
    mlp.double()(x.double())  # float64: torch's layers
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mlp.float()(x)
    assert out.dtype == torch.bfloat16  # autocast ran torch's bf16 layers
    assert calls == []

    monkeypatch.setattr(mlp_module, "_PREFERRED", False)
    MLP(16, [32], kernel="auto")(x)
    assert calls == []
    monkeypatch.setattr(mlp_module, "_PREFERRED", True)
    MLP(16, [32], kernel="auto")(x)
    assert calls == []  # 8 x 16 x 32 multiply-adds: too small to gain
    monkeypatch.setattr(mlp_module, "NATIVE_MIN_WORK", 8 * 16 * 32)
    MLP(16, [32], kernel="auto")(x)
    assert calls == [(8, 32, 16)]


def test_kernels_share_parameters_and_state_dict() -> None:
    torch.manual_seed(1)
    native = MLP(20, [48, 24], kernel="native")
    plain = MLP(20, [48, 24], kernel="torch")
    assert native.state_dict().keys() == plain.state_dict().keys()
    plain.load_state_dict(native.state_dict())
    x = torch.randn(64, 20)
    torch.testing.assert_close(native(x), plain(x))
    twin = copy.deepcopy(native)  # memory of its own, same values
    assert twin.native_buffers[0] is not native.native_buffers[0]
    torch.testing.assert_close(twin(x), plain(x))


def test_outputs_kept_by_the_caller_are_not_overwritten() -> None:
    mlp = MLP(20, [48], kernel="native")
    with torch.no_grad():
        first = mlp(torch.ones(10, 20))
        kept = first.clone()
        mlp(torch.zeros(10, 20))  # the layer's buffer is still held by ``first``
    torch.testing.assert_close(first, kept)


def test_double_backward_raises() -> None:
    mlp = MLP(20, [48], kernel="native")
    x = torch.randn(4, 20, requires_grad=True)
    (grad,) = torch.autograd.grad(mlp(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        grad.sum().backward()


def test_unknown_kernel_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown dense kernel"):
        MLP(4, [8], kernel="mkl")  # type: ignore[arg-type]
