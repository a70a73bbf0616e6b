"""The MLPs' layers on CPU: ctrctl's GEMM (``_dense_kernel.c``) against torch's, in one run.

bench_train's MLPs (dense arch 13 -> 512 -> 256 -> 64, over arch 416 -> 512 -> 256 -> 1),
batch 4096, float32, on ``--threads`` threads:

* per layer (ReLU after it): forward (ctrctl: bias and ReLU in the GEMM; torch: ``addmm`` +
  ``relu_``) and backward (ctrctl: dx and dW on the ReLU-masked gradient, the bias gradient
  summed while packing it; torch: ``threshold_backward``, two ``mm`` and a ``sum``);
* whole MLPs, forward + backward through autograd: ``MLP(kernel="native")`` against
  ``MLP(kernel="torch")`` (``nn.Linear`` + ``nn.ReLU``).

Both sides take turns call by call, so load from other processes falls on both alike;
reported are the median over ``--repeats`` of the median of ``--calls`` calls, the spread
(min-max) over repeats, and ratios taken within each repeat. ``kernel="auto"`` runs ctrctl's
GEMM only on CPUs where it is the faster one (AMD's with AVX2 + FMA); this benchmark runs it
on any CPU, so that the choice can be checked.

Usage:
    python scripts/bench_dense.py [--quick] [--threads 1] [--calls 15] [--repeats 3]
                                  [--out bench-out/dense.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ctrctl.io import write_json_atomic
from ctrctl.modules import mlp as mlp_module
from ctrctl.modules.mlp import MLP, native_dense_available, native_dense_preferred

BATCH = 4096
LAYERS = [(13, 512), (512, 256), (256, 64), (416, 512)]  # (512, 256) is in both MLPs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 512, few calls")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=15, help="timed calls per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-out/dense.json"))
    return parser.parse_args(argv)


def native_forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                   out: torch.Tensor) -> None:
    rows, n_in = x.shape
    mlp_module._gemm(rows, w.size(0), n_in, x, (n_in, 1), w, (1, n_in), out, bias=b, relu=True)


def native_backward(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, grad: torch.Tensor,
                    dx: torch.Tensor, dw: torch.Tensor, db: torch.Tensor) -> None:
    rows, n_in = x.shape
    n_out = w.size(0)
    mlp_module._gemm(rows, n_in, n_out, grad, (n_out, 1), w, (n_in, 1), dx, mask=out)
    db.zero_()
    mlp_module._gemm(n_out, n_in, rows, grad, (1, n_out), x, (n_in, 1), dw, mask=out,
                     row_sums=db)


def torch_backward(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                   grad: torch.Tensor) -> None:
    g = torch.ops.aten.threshold_backward(grad, out, 0.0)
    g.mm(w)
    g.t().mm(x)
    g.sum(0)


def cases(batch: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (ctrctl's call, torch's call), inputs made once."""
    gen = torch.Generator().manual_seed(0)
    made: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {}
    for n_in, n_out in LAYERS:
        x = torch.randn(batch, n_in, generator=gen)
        w = torch.randn(n_out, n_in, generator=gen) / n_in ** 0.5
        b = torch.randn(n_out, generator=gen)
        out = torch.empty(batch, n_out)
        native_forward(x, w, b, out)
        grad = torch.randn(batch, n_out, generator=gen)
        dx, dw, db = torch.empty(batch, n_in), torch.empty(n_out, n_in), torch.empty(n_out)
        name = f"{n_in} -> {n_out}"
        made[f"{name} forward"] = (
            lambda x=x, w=w, b=b, out=out: native_forward(x, w, b, out),
            lambda x=x, w=w, b=b: torch.addmm(b, x, w.t()).relu_(),
        )
        made[f"{name} backward"] = (
            lambda x=x, w=w, out=out, g=grad, dx=dx, dw=dw, db=db: native_backward(
                x, w, out, g, dx, dw, db),
            lambda x=x, w=w, out=out, g=grad: torch_backward(x, w, out, g),
        )
    for arch, n_in, sizes, final in (("dense arch", 13, [512, 256, 64], True),
                                     ("over arch", 416, [512, 256, 1], False)):
        torch.manual_seed(0)
        native = MLP(n_in, sizes, final_activation=final, kernel="native")
        plain = MLP(n_in, sizes, final_activation=final, kernel="torch")
        plain.load_state_dict(native.state_dict())
        x = torch.randn(batch, n_in, generator=gen, requires_grad=arch == "over arch")

        def step(mlp: MLP = native, x: torch.Tensor = x) -> None:
            mlp.zero_grad(set_to_none=True)
            mlp(x).sum().backward()

        made[f"{arch} forward + backward"] = (step, lambda plain=plain, x=x: step(plain, x))
    return made


def time_pair(pair: tuple[Callable[[], object], Callable[[], object]], calls: int,
              warmup: int = 3) -> tuple[float, float]:
    """Median ms of each side, the two taking turns call by call."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(warmup + calls):
        for side in (0, 1):
            start = time.perf_counter()
            pair[side]()
            if i >= warmup:
                times[side].append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not native_dense_available():
        print("the C dense kernel was not built (no C compiler at install time)")
        return 0
    if args.quick:
        args.calls, args.repeats = 5, 1
    batch = 512 if args.quick else BATCH
    torch.set_num_threads(args.threads)
    made = cases(batch)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in made}
    loads = [" ".join(f"{v:.2f}" for v in os.getloadavg())]
    for _ in range(args.repeats):
        for name, pair in made.items():
            runs[name].append(time_pair(pair, args.calls))
        loads.append(" ".join(f"{v:.2f}" for v in os.getloadavg()))

    print(f"MLP layers, batch {batch}, {args.threads} thread(s), float32; median over "
          f"{args.repeats} repeats of the median of {args.calls} calls [min-max]")
    print(f"{'':32s} {'ctrctl ms':>10s} {'torch ms':>10s} {'torch / ctrctl':>22s}")
    results = {}
    for name, pairs in runs.items():
        ours = [p[0] for p in pairs]
        theirs = [p[1] for p in pairs]
        ratios = [t / o for o, t in pairs]
        results[name] = {
            "ctrctl_ms": statistics.median(ours), "torch_ms": statistics.median(theirs),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
        print(f"{name:32s} {statistics.median(ours):10.2f} {statistics.median(theirs):10.2f}"
              f" {statistics.median(ratios):9.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
    assert mlp_module._ext is not None
    notes = {
        "gemm loops": mlp_module._ext.isa(),
        "auto runs ctrctl's GEMM here": native_dense_preferred(),
        "loadavg": loads,
    }
    for key, value in notes.items():
        print(f"{key}: {value}")
    write_json_atomic(args.out, {"batch": batch, "threads": args.threads,
                                 "results": results, **notes})
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
