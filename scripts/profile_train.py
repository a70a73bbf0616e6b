"""Where a DLRM training step's time goes on CPU, per phase (torch.profiler, median ms).

The model of scripts/bench_train.py (26 tables x 100,000 x 64, 13 dense features, dense arch
512,256,64, dot interaction, over arch 512,256,1, batch 4096, fused row-wise Adagrad on the
tables, Adagrad on the rest). Each step runs DLRM.forward's pieces under profiler labels
(the same calls in the same order), then backward and the dense optimizer. Phases:

* forward: ``embedding lookup``, ``dense MLP fwd`` (bottom), ``interaction fwd``,
  ``over MLP fwd`` (top) and the loss;
* backward, from autograd's nodes: ``embedding bwd + update`` (the lookup's backward node,
  the fused optimizer included), ``interaction bwd``, ``MLP bwd`` (every other node: linear
  layers, ReLUs, the loss);
* ``dense optimizer`` (zero_grad + step);
* ``python + other``: the step's wall time minus the phases above (Python, autograd's
  bookkeeping between nodes, allocation).

Usage:
    python scripts/profile_train.py [--backend auto] [--threads 2] [--steps 8] [--bf16]
                                    [--out bench-out/profile.json]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ctrctl.io import write_json_atomic
from ctrctl.modules import (
    DLRM,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingOptimizerConfig,
    dlrm_loss,
)
from ctrctl.sparse import KeyedJaggedTensor

FORWARD_PHASES = ("embedding lookup", "dense MLP fwd", "interaction fwd", "over MLP fwd", "loss")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", help="embedding kernel: auto, native, "
                        "fbgemm, torch")
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast on the dense part")
    parser.add_argument("--out", type=Path, default=Path("bench-out/profile.json"))
    return parser.parse_args(argv)


def backward_phase(name: str) -> str:
    """The phase of one autograd node (its profiler name)."""
    if "Lookup" in name or "SplitLookup" in name or "EmbeddingBag" in name:
        return "embedding bwd + update"
    if "PairwiseDot" in name or "Bmm" in name:
        return "interaction bwd"
    return "MLP bwd"


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    keys = [f"C{i}" for i in range(args.tables)]
    ebc = EmbeddingBagCollection(
        [EmbeddingBagConfig(f"t_{k}", args.rows, args.dim, [k]) for k in keys],
        optimizer=EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=0.01, eps=1e-8),
        backend=args.backend,
    )
    model = DLRM(ebc, 13, [512, 256, args.dim], [512, 256, 1])
    assert model.dense_arch is not None
    optimizer = torch.optim.Adagrad(model.dense_parameters(), lr=0.01, fused=True)
    gen = torch.Generator().manual_seed(0)
    batch = args.batch_size
    n = args.warmup + args.steps
    lengths = torch.ones(args.tables * batch, dtype=torch.long)
    data = [
        (
            torch.rand(batch, 13, generator=gen),
            KeyedJaggedTensor(keys, torch.randint(0, args.rows, (args.tables * batch,),
                                                  generator=gen), lengths=lengths),
            torch.randint(0, 2, (batch,), generator=gen).float(),
        )
        for _ in range(n)
    ]

    def step(i: int) -> None:
        dense, kjt, labels = data[i]
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16
                    else contextlib.nullcontext())
        with record_function("embedding lookup"):
            pooled = model.sparse_arch(kjt).values()
        sparse = pooled.view(batch, args.tables, args.dim)  # (B, F, D)
        with autocast:
            with record_function("dense MLP fwd"):
                embedded = model.dense_arch(dense)  # (B, D)
            with record_function("interaction fwd"):
                x = model.interaction(embedded, sparse.to(embedded.dtype))
            with record_function("over MLP fwd"):
                logits = model.over_arch(x).squeeze(1).float()
        with record_function("loss"):
            loss = dlrm_loss(logits, labels)
        with record_function("backward"):
            loss.backward()
        with record_function("dense optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for i in range(args.warmup):
        step(i)
    walls: list[float] = []
    per_step: list[dict[str, float]] = []
    for i in range(args.warmup, n):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            step(i)
            walls.append((time.perf_counter() - start) * 1000)
        phases: dict[str, float] = defaultdict(float)
        for event in prof.events():
            name = event.name
            ms = event.cpu_time_total / 1000
            if name in FORWARD_PHASES or name == "dense optimizer":
                phases[name] += ms
            elif name.startswith("autograd::engine::evaluate_function: "):
                phases[backward_phase(name.split(": ", 1)[1])] += ms
        phases["python + other"] = walls[-1] - sum(phases.values())
        per_step.append(dict(phases))
    names = list(dict.fromkeys(k for p in per_step for k in p))
    medians = {k: statistics.median(p.get(k, 0.0) for p in per_step) for k in names}
    # Profiling adds its own cost per op: the step time without the profiler, for scale.
    plain = []
    for i in range(args.warmup, n):
        start = time.perf_counter()
        step(i)
        plain.append((time.perf_counter() - start) * 1000)
    return {
        "benchmark": "profile_train",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "embedding_backends": ebc.backends(),
        "median_ms": medians,
        "median_step_ms_profiled": statistics.median(walls),
        "median_step_ms_unprofiled": statistics.median(plain),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(f"DLRM step on {args.threads} threads, batch {args.batch_size}, embedding kernel "
          f"{report['embedding_backends']}, bf16 {args.bf16}: median ms per phase")
    total = report["median_step_ms_profiled"]
    for name, ms in sorted(report["median_ms"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:<24} {ms:8.1f}  {100 * ms / total:5.1f}%")
    print(f"  step (profiled)          {total:8.1f}")
    print(f"  step (no profiler)       {report['median_step_ms_unprofiled']:8.1f}")
    write_json_atomic(args.out, report)
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
