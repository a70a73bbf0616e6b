"""The native kernels against the library paths they must beat, on this CPU, in one run.

Two baselines the native tier's rule asks for (``docs/native-kernels.md``):

* **gemm**: one linear layer + ReLU forward, float32, on ctrctl's hand GEMM
  (``_dense_kernel.c``, bias and ReLU fused), on oneDNN's fused linear
  (``torch.ops.mkldnn._linear_pointwise(..., "relu")``) and on torch's ``addmm`` + ``relu_``
  (MKL), for bench_train's layer shapes;
* **compile**: DLRM's dense part (bottom MLP 13 -> 512 -> 256 -> 64, dot interaction of 26
  pooled embeddings, top MLP 416 -> 512 -> 256 -> 1) forward + backward, on the native
  kernels (``kernel="native"``), eager torch (``kernel="torch"``) and ``torch.compile`` of
  the torch path (Inductor; compile time reported apart).

The contenders take turns call by call, so load from other processes falls on all alike;
reported are the median over ``--repeats`` of the median of ``--calls`` calls, and the
spread (min-max) over repeats. The ratio is the contender's time over the native one
(above 1: native is faster).

Usage:
    python scripts/bench_baselines.py [--quick] [--threads 2] [--calls 11] [--repeats 3]
                                      [--only gemm|compile] [--out bench-out/baselines.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ctrctl.io import write_json_atomic
from ctrctl.modules import native
from ctrctl.modules.interaction import DotInteraction
from ctrctl.modules.mlp import MLP, native_dense_available
from ctrctl.modules.native.buffers import ReusableBuffer

LAYERS = [(13, 512), (512, 256), (256, 64), (416, 512)]
SPARSE_FEATURES, DIM = 26, 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 1024, few calls")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=11, help="timed calls per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["gemm", "compile"], default=None)
    parser.add_argument("--out", type=Path, default=Path("bench-out/baselines.json"))
    return parser.parse_args(argv)


def race(contenders: dict[str, Callable[[], Any]], calls: int, repeats: int
         ) -> dict[str, dict[str, float]]:
    """Median seconds per call of each contender, taking turns call by call."""
    for fn in contenders.values():  # warm-up
        fn()
    per_repeat: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(calls):
            for name, fn in contenders.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        for name, values in times.items():
            per_repeat[name].append(statistics.median(values))
    return {name: {"median_ms": 1e3 * statistics.median(v), "min_ms": 1e3 * min(v),
                   "max_ms": 1e3 * max(v)} for name, v in per_repeat.items()}


def bench_layer(batch: int, n_in: int, n_out: int, gen: torch.Generator, calls: int,
                repeats: int) -> dict[str, Any]:
    """One layer + ReLU forward on the three GEMMs (checked to agree first)."""
    from ctrctl.modules import mlp as mlp_module

    x = torch.randn(batch, n_in, generator=gen)
    w = torch.randn(n_out, n_in, generator=gen) / n_in ** 0.5
    b = torch.randn(n_out, generator=gen)
    out = ReusableBuffer()

    def hand() -> None:
        y = out.get((batch, n_out), torch.float32)
        mlp_module._gemm(batch, n_out, n_in, x, (n_in, 1), w, (1, n_in), y, bias=b,
                         relu=True)

    def onednn() -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "relu", [], "")

    def mkl() -> torch.Tensor:
        return torch.addmm(b, x, w.t()).relu_()

    hand()
    torch.testing.assert_close(out.get((batch, n_out), torch.float32), mkl(),
                               rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(onednn(), mkl(), rtol=1e-4, atol=1e-3)
    found = race({"native": hand, "onednn": onednn, "torch_mkl": mkl}, calls, repeats)
    print(f"gemm {n_in:>3} -> {n_out:<3}: " + ", ".join(
        f"{k} {v['median_ms']:.3f} ms [{v['min_ms']:.3f}-{v['max_ms']:.3f}]"
        for k, v in found.items()), flush=True)
    return {"layer": f"{n_in}x{n_out}", "batch": batch, **found}


def bench_gemm(batch: int, calls: int, repeats: int) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    return [bench_layer(batch, n_in, n_out, gen, calls, repeats) for n_in, n_out in LAYERS]


class DenseArch(torch.nn.Module):
    """DLRM's dense part: bottom MLP, dot interaction with pooled embeddings, top MLP."""

    def __init__(self, kernel: native.Kernel) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bottom = MLP(13, [512, 256, DIM], kernel=kernel)
        self.interaction = DotInteraction(SPARSE_FEATURES, pad_to=2, kernel=kernel)
        width = self.interaction.output_dim(DIM)
        self.top = MLP(width, [512, 256, 1], final_activation=False, kernel=kernel)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.top(self.interaction(self.bottom(dense), pooled)).squeeze(-1)


def bench_compile(batch: int, calls: int, repeats: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(batch, 13, generator=gen)
    pooled = torch.randn(batch, SPARSE_FEATURES, DIM, generator=gen, requires_grad=True)
    models = {"native": DenseArch("native"), "torch_eager": DenseArch("torch")}
    compiled = DenseArch("torch")
    started = time.perf_counter()
    compiled_fn = torch.compile(compiled)

    def step(model: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            model(dense, pooled).sum().backward()
        return run

    step(compiled_fn)()  # compiles forward and backward
    compile_s = time.perf_counter() - started
    contenders = {name: step(m) for name, m in models.items()}
    contenders["torch_compile"] = step(compiled_fn)
    found = race(contenders, calls, repeats)
    print(f"dense arch fwd+bwd, batch {batch}: " + ", ".join(
        f"{k} {v['median_ms']:.2f} ms [{v['min_ms']:.2f}-{v['max_ms']:.2f}]"
        for k, v in found.items()) + f"; compile {compile_s:.1f} s", flush=True)
    return {"batch": batch, "compile_s": compile_s, **found}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not native_dense_available():
        print("the native kernels were not built: nothing to compare", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    batch, calls = (1024, 5) if args.quick else (args.batch, args.calls)
    report = native.report()
    print(report, flush=True)
    result: dict[str, Any] = {
        "cpu": report.cpu, "threads": args.threads, "torch": torch.__version__,
        "loadavg_before": os.getloadavg(), "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if args.only in (None, "gemm"):
        result["gemm"] = bench_gemm(batch, calls, args.repeats)
    if args.only in (None, "compile"):
        result["compile"] = bench_compile(batch, calls, args.repeats)
    result["loadavg_after"] = os.getloadavg()
    write_json_atomic(args.out, result)
    print(f"load average before {result['loadavg_before']}, after {result['loadavg_after']}; "
          f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
