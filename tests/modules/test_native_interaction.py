"""The C dot interaction against an independent float64 reference, and where it runs."""

from __future__ import annotations

import pytest
import torch

from ctrctl.errors import ConfigError
from ctrctl.modules import interaction as interaction_module
from ctrctl.modules.dlrm import SparseDotInteraction
from ctrctl.modules.interaction import DotInteraction, native_interaction_available

pytestmark = pytest.mark.skipif(not native_interaction_available(),
                                reason="the C interaction kernel was not built")


def reference(dense: torch.Tensor | None, sparse: torch.Tensor, width: int) -> torch.Tensor:
    """[dense, upper triangle of x x^T, zeros] in float64 by cat + bmm + gather."""
    x = sparse if dense is None else torch.cat([dense.unsqueeze(1), sparse], dim=1)
    x = x.double()
    n = x.size(1)
    rows, cols = torch.triu_indices(n, n, offset=1)
    pairs = torch.bmm(x, x.transpose(1, 2))[:, rows, cols]
    parts = [pairs] if dense is None else [dense.double(), pairs]
    out = torch.cat(parts, dim=1)
    return torch.nn.functional.pad(out, (0, width - out.size(1)))


def module(features: int, with_dense: bool, pad_to: int, kernel: str = "auto") -> torch.nn.Module:
    if with_dense:
        return DotInteraction(features, pad_to=pad_to, kernel=kernel)  # type: ignore[arg-type]
    return SparseDotInteraction(features, pad_to=pad_to, kernel=kernel)  # type: ignore[arg-type]


def call(mod: torch.nn.Module, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
    return mod(dense, sparse) if isinstance(mod, DotInteraction) else mod(sparse)


LOOPS = ("avx512f", "avx2", "base")  # the kernel's widths: 16, 8 and 4 floats a vector


@pytest.fixture(params=LOOPS)
def loops(request: pytest.FixtureRequest) -> object:
    """Each width of the C loops that this CPU runs, in turn (the one picked at import is
    put back after)."""
    ext = interaction_module._ext
    picked = next(name for name in LOOPS if ext.use(name))
    try:
        if not ext.use(request.param):
            pytest.skip(f"this CPU does not run the {request.param} loops")
        yield request.param
    finally:
        ext.use(picked)


def test_the_widest_loops_the_cpu_runs_are_picked() -> None:
    ext = interaction_module._ext
    widest = next(name for name in LOOPS if ext.use(name))  # use() leaves it in place
    described = ext.isa()
    assert described.startswith(widest.replace("avx2", "avx2+fma"))
    with pytest.raises(ValueError, match="no loops named 'sse9'"):
        ext.use("sse9")


# (sparse features, dim, batch, pad_to): dims below, at and past the 4-, 8-, 16- and 64-wide
# blocks,
# vector counts below and past the 8-row groups, an odd and an even count (backward pairs
# rows), a batch of one and an empty one.
SHAPES = [(26, 64, 257, 8), (1, 16, 5, 1), (2, 5, 3, 4), (5, 17, 9, 8), (9, 80, 6, 1),
          (40, 33, 7, 16), (3, 128, 1, 1), (7, 64, 0, 8)]


@pytest.mark.parametrize("with_dense", [True, False])
@pytest.mark.parametrize(("features", "dim", "batch", "pad_to"), SHAPES)
def test_forward_and_backward_match_the_reference(
    features: int, dim: int, batch: int, pad_to: int, with_dense: bool, loops: str
) -> None:
    if not with_dense and features < 2:  # one embedding has no pair: refused, not run
        with pytest.raises(ConfigError, match="two sparse features"):
            module(features, with_dense, pad_to)
        return
    gen = torch.Generator().manual_seed(features * 1000 + dim)
    dense = torch.randn(batch, dim, generator=gen, requires_grad=True)
    sparse = torch.randn(batch, features, dim, generator=gen, requires_grad=True)
    mod = module(features, with_dense, pad_to)
    out = call(mod, dense, sparse)
    width = out.size(1)
    assert width % pad_to == 0
    expected = reference(dense if with_dense else None, sparse, width)
    torch.testing.assert_close(out, expected.float())

    upstream = torch.randn(out.shape, generator=gen)
    inputs = (dense, sparse) if with_dense else (sparse,)
    got = torch.autograd.grad(out, inputs, upstream)
    want = torch.autograd.grad(expected, inputs, upstream.double())
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32 and g.is_contiguous()
        torch.testing.assert_close(g, w.float())


def test_the_c_kernel_runs_and_agrees_with_torch_s_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """"auto" calls the C kernel on float32 CPU tensors; "torch" never does."""
    gen = torch.Generator().manual_seed(3)
    dense, sparse = torch.randn(64, 16, generator=gen), torch.randn(64, 6, 16, generator=gen)
    calls: list[str] = []
    real = interaction_module._ext

    class Spy:
        def forward(self, *args: object) -> None:
            calls.append("forward")
            real.forward(*args)

        def backward(self, *args: object) -> None:
            calls.append("backward")
            real.backward(*args)

    monkeypatch.setattr(interaction_module, "_ext", Spy())
    native = DotInteraction(6, pad_to=8)(dense.requires_grad_(), sparse.requires_grad_())
    native.sum().backward()
    assert calls == ["forward", "backward"]
    plain = DotInteraction(6, pad_to=8, kernel="torch")(dense, sparse)
    assert calls == ["forward", "backward"]
    torch.testing.assert_close(native, plain)


def test_threads_do_not_change_the_result(loops: str) -> None:
    """Samples are split over threads, each computed alone: 1 and 2 threads agree bitwise."""
    gen = torch.Generator().manual_seed(4)
    dense, sparse = torch.randn(301, 64, generator=gen), torch.randn(301, 26, 64, generator=gen)
    upstream = torch.randn(301, 416, generator=gen)
    mod = DotInteraction(26, pad_to=8)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            d, s = dense.clone().requires_grad_(), sparse.clone().requires_grad_()
            out = mod(d, s)
            out.backward(upstream)
            results.append((out, d.grad, s.grad))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_other_dtypes_non_contiguous_inputs_and_export_take_a_valid_path() -> None:
    gen = torch.Generator().manual_seed(5)
    mod = DotInteraction(4, pad_to=8)
    dense = torch.randn(8, 16, generator=gen)
    sparse = torch.randn(8, 16, 4, generator=gen).transpose(1, 2)  # (B, F, D), not contiguous
    torch.testing.assert_close(mod(dense, sparse), reference(dense, sparse, 32).float())
    bf16 = mod(dense.bfloat16(), sparse.bfloat16())  # torch's ops
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), reference(dense, sparse, 32).float(), atol=0.5,
                               rtol=0.05)
    # torch.export traces with fake tensors: the torch ops go into the program, no C call
    program = torch.export.export(mod, (dense, sparse.contiguous()), strict=False)
    targets = {str(node.target) for node in program.graph.nodes}
    assert any("bmm" in t for t in targets)
    torch.testing.assert_close(program.module()(dense, sparse.contiguous()), mod(dense, sparse))


def test_the_kernel_refuses_sizes_it_cannot_hold() -> None:
    ext = interaction_module._ext
    out = torch.empty(2, 3)
    sparse = torch.randn(2, 2, 4)
    with pytest.raises(ValueError, match="output narrower"):  # 1 pair needs 1 column: 0 given
        ext.forward(2, 2, 4, 0, sparse.data_ptr(), out.data_ptr(), 0, 1)
    with pytest.raises(ValueError, match="bad sizes"):  # no sparse feature
        ext.forward(2, 0, 4, 0, sparse.data_ptr(), out.data_ptr(), 3, 1)
    with pytest.raises(ValueError, match="dense gradient"):
        ext.backward(2, 2, 4, sparse.data_ptr(), sparse.data_ptr(), out.data_ptr(), 7, 0,
                     sparse.data_ptr(), 1)


def test_a_second_derivative_is_refused() -> None:
    """The C backward is not differentiable: differentiating it raises (kernel="torch" is
    twice differentiable)."""
    gen = torch.Generator().manual_seed(6)
    dense = torch.randn(4, 8, generator=gen, requires_grad=True)
    sparse = torch.randn(4, 3, 8, generator=gen, requires_grad=True)
    out = DotInteraction(3)(dense, sparse)
    upstream = torch.randn(out.shape, generator=gen, requires_grad=True)
    (grad,) = torch.autograd.grad(out, sparse, upstream, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()
    plain = DotInteraction(3, kernel="torch")(dense, sparse)
    (grad,) = torch.autograd.grad(plain, sparse, upstream, create_graph=True)
    grad.sum().backward()  # torch's ops: fine
    assert upstream.grad is not None


def test_memory_is_reused_between_steps_and_results_stay_the_same() -> None:
    """The module's output and gradients come back in the previous step's memory when
    nothing holds it; held tensors are never overwritten."""
    interaction = DotInteraction(5, pad_to=4)
    gen = torch.Generator().manual_seed(0)
    steps = [(torch.randn(7, 8, generator=gen), torch.randn(7, 5, 8, generator=gen))
             for _ in range(3)]
    ptrs, kept = [], []
    for i, (dense, sparse) in enumerate(steps):
        d, s = dense.clone().requires_grad_(), sparse.clone().requires_grad_()
        out = interaction(d, s)
        out.backward(torch.ones_like(out))
        assert s.grad is not None
        ptrs.append((out.data_ptr(), s.grad.data_ptr()))
        if i == 0:
            kept = [out.detach(), s.grad]  # held: step 1 must use other memory
        d2, s2 = dense.clone().requires_grad_(), sparse.clone().requires_grad_()
        ref = DotInteraction(5, pad_to=4, kernel="torch")(d2, s2)
        ref.backward(torch.ones_like(ref))
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(s.grad, s2.grad)
        del out, d, s
    assert ptrs[1][0] != ptrs[0][0] and ptrs[1][1] != ptrs[0][1]
    assert ptrs[2] == ptrs[1]  # step 1's output and gradient were free again
    torch.testing.assert_close(kept[0], DotInteraction(5, pad_to=4, kernel="torch")(*steps[0]))
