"""Quantized serving latency and throughput: ctrctl FP32 / INT8 / INT4 beside TorchRec 1.8.0.

One DLRM (26 tables x 100,000 rows x dim 64, 13 dense, dense arch 512,256,64, over arch
512,256,1, dot interaction), in one process on ``--threads`` threads (default 2):

* ``ctrctl fp32``: the trained model (FBGEMM's training TBE, forward only, no grad);
* ``ctrctl int8`` / ``int4``: the serving model (FBGEMM's IntN TBE, rows aligned to 1);
* ``ctrctl int8 exported``: the ``torch.export`` program of the INT8 serving model;
* ``ctrctl int8 bf16-dense``: INT8 tables pooled into bfloat16, the interaction and MLPs in
  bfloat16 (``--dense-dtype bf16``; on CPUs with AMX or AVX512-BF16 oneDNN's bf16 GEMMs);
* ``ctrctl int8 bf16 compiled``: that model's exported program compiled by TorchInductor
  as ``serving.load(..., compile=True)`` compiles it (``standalone.compile_program``);
* ``torchrec fp32`` / ``int8`` / ``int4``: TorchRec's DLRM on the same tables, and
  ``torchrec.inference.modules.quantize_inference_model`` of it (``qint8`` / ``quint4x2``).
  TorchRec is a benchmark reference only (``make bench-setup`` installs it).

Measured: latency of one request of ``--candidates`` (512) rows with one id per feature
(p50 / p99 over ``--requests`` requests, every request fresh random ids), and throughput in
batches of 4096 (median over ``--batches`` batches, with min and max). The variants take
turns in rounds so that a change of load on the shared machine hits them all alike; the
load average is recorded before and after.

Usage:
    python scripts/bench_inference.py [--quick] [--out bench-out/inference.json]
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

import numpy as np
import torch

from ctrctl.inference.export import export_program
from ctrctl.inference.quantize import QuantizeConfig, quantize_dlrm
from ctrctl.inference.standalone import compile_program
from ctrctl.io import write_json_atomic
from ctrctl.modules import DLRM, EmbeddingBagCollection, EmbeddingBagConfig
from ctrctl.sparse import KeyedJaggedTensor

NUM_TABLES, ROWS, DIM, NUM_DENSE = 26, 100_000, 64, 13
DENSE_ARCH, OVER_ARCH = [512, 256, 64], [512, 256, 1]
BATCH = 4096


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 requests, 3 batches")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=512)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-torchrec", action="store_true", help="ctrctl only")
    parser.add_argument("--out", type=Path, default=Path("bench-out/inference.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.batches, args.rounds = 200, 3, 2
    return args


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


# ---- inputs -----------------------------------------------------------------------------------
def make_inputs(batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One id per feature and sample, uniform over the rows; dense ~ log1p of counts."""
    ids = torch.randint(0, ROWS, (NUM_TABLES * batch,), generator=generator)
    dense = torch.rand(batch, NUM_DENSE, generator=generator) * 5
    return {"dense": dense, "ids": ids,
            "lengths": torch.ones(NUM_TABLES * batch, dtype=torch.int64)}


# ---- models -----------------------------------------------------------------------------------
def build_ctrctl() -> DLRM:
    tables = [EmbeddingBagConfig(f"t{i}", ROWS, DIM, [f"f{i}"]) for i in range(NUM_TABLES)]
    return DLRM(EmbeddingBagCollection(tables, seed=0), NUM_DENSE, DENSE_ARCH, OVER_ARCH).eval()


def build_torchrec(ours: DLRM) -> Any:
    from torchrec.models.dlrm import DLRM as TorchrecDLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig as TrConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection as TrEBC

    ebc = TrEBC(tables=[TrConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS,
                                 feature_names=[f"f{i}"]) for i in range(NUM_TABLES)],
                device=torch.device("cpu"))
    weights = ours.sparse_arch.embedding_bag_weights()
    with torch.no_grad():
        for name, bag in ebc.embedding_bags.items():
            bag.weight.copy_(weights[name])  # the same tables; the MLPs have the same shapes
    return TorchrecDLRM(embedding_bag_collection=ebc, dense_in_features=NUM_DENSE,
                        dense_arch_layer_sizes=DENSE_ARCH,
                        over_arch_layer_sizes=OVER_ARCH).eval()


def torchrec_quantized(model: Any, dtype: torch.dtype) -> Any:
    import copy

    from torchrec.inference.modules import quantize_inference_model

    return quantize_inference_model(copy.deepcopy(model), quantization_dtype=dtype,
                                    output_dtype=torch.float).eval()


def runners(args: argparse.Namespace) -> dict[str, Callable[[dict[str, torch.Tensor]], Any]]:
    keys = [f"f{i}" for i in range(NUM_TABLES)]
    ours = build_ctrctl()
    out: dict[str, Callable[[dict[str, torch.Tensor]], Any]] = {}

    def ctrctl_fp32(x: dict[str, torch.Tensor]) -> Any:
        kjt = KeyedJaggedTensor.from_lengths_sync(keys, x["ids"], x["lengths"])
        return torch.sigmoid(ours(x["dense"], kjt))

    out["ctrctl fp32"] = ctrctl_fp32
    for dtype in ("int8", "int4"):
        serving, _, _ = quantize_dlrm(ours, QuantizeConfig(dtype=dtype))
        out[f"ctrctl {dtype}"] = (lambda m: lambda x: m(x["dense"], x["ids"], x["lengths"]))(
            serving)
        if dtype == "int8":
            program = export_program(serving).module()
            out["ctrctl int8 exported"] = (
                lambda m: lambda x: m(x["dense"], x["ids"], x["lengths"]))(program)
            bf16, _, _ = quantize_dlrm(ours, QuantizeConfig(dtype=dtype, dense_dtype="bf16"))
            out["ctrctl int8 bf16-dense"] = (
                lambda m: lambda x: m(x["dense"], x["ids"], x["lengths"]))(bf16)
            compiled = compile_program(export_program(bf16), NUM_DENSE, NUM_TABLES,
                                       batch=args.candidates)
            out["ctrctl int8 bf16 compiled"] = (
                lambda m: lambda x: m(x["dense"], x["ids"], x["lengths"]))(compiled)
    if not args.no_torchrec:
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor as TrKJT

        reference = build_torchrec(ours)
        models = {"torchrec fp32": reference,
                  "torchrec int8": torchrec_quantized(reference, torch.qint8),
                  "torchrec int4": torchrec_quantized(reference, torch.quint4x2)}
        for name, model in models.items():
            def run(x: dict[str, torch.Tensor], model: Any = model) -> Any:
                kjt = TrKJT(keys=keys, values=x["ids"], lengths=x["lengths"])
                return torch.sigmoid(model(x["dense"], kjt))

            out[name] = run
    return out


# ---- measuring --------------------------------------------------------------------------------
def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    fns = runners(args)
    print(f"built {', '.join(fns)}", file=sys.stderr, flush=True)
    requests = [make_inputs(args.candidates, generator) for _ in range(args.requests)]
    batches = [make_inputs(BATCH, generator) for _ in range(args.batches)]
    latency: dict[str, list[float]] = {name: [] for name in fns}
    throughput: dict[str, list[float]] = {name: [] for name in fns}
    per_round = max(1, len(requests) // args.rounds)
    with torch.no_grad():  # (inference_mode: the training TBE has no CPU kernel there)
        for fn in fns.values():  # warm-up: first calls allocate and pick kernels
            for x in requests[:20]:
                fn(x)
            fn(batches[0])
        for r in range(args.rounds):
            print(f"latency round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
            chunk = requests[r * per_round:(r + 1) * per_round]
            for name, fn in fns.items():
                for x in chunk:
                    start = time.perf_counter()
                    fn(x)
                    latency[name].append(time.perf_counter() - start)
        print("throughput", file=sys.stderr, flush=True)
        for x in batches:
            for name, fn in fns.items():
                start = time.perf_counter()
                fn(x)
                throughput[name].append(BATCH / (time.perf_counter() - start))
    results: dict[str, Any] = {}
    for name in fns:
        times = np.asarray(latency[name]) * 1e3
        rates = throughput[name]
        results[name] = {
            "p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)),
            "mean_ms": float(times.mean()), "requests": int(times.size),
            "samples_per_s": statistics.median(rates), "samples_per_s_min": min(rates),
            "samples_per_s_max": max(rates)}
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    before = loadavg()
    started = time.perf_counter()
    results = measure(args)
    after = loadavg()
    print(f"\n{args.requests} requests of {args.candidates} candidates, batches of {BATCH}, "
          f"{args.threads} threads; loadavg before {before} / after {after}")
    print(f"{'variant':26} {'p50 ms':>8} {'p99 ms':>8} {'samples/s':>11} {'min..max':>17}")
    for name, r in results.items():
        print(f"{name:26} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['samples_per_s']:11,.0f} "
              f"{r['samples_per_s_min']:8,.0f}..{r['samples_per_s_max']:,.0f}")
    ratios = {}
    for dtype in ("fp32", "int8", "int4"):
        ours, theirs = results.get(f"ctrctl {dtype}"), results.get(f"torchrec {dtype}")
        if ours and theirs:
            ratios[dtype] = {"throughput_x": ours["samples_per_s"] / theirs["samples_per_s"],
                             "p50_x": theirs["p50_ms"] / ours["p50_ms"],
                             "p99_x": theirs["p99_ms"] / ours["p99_ms"]}
            print(f"{dtype}: ctrctl/torchrec throughput {ratios[dtype]['throughput_x']:.2f}x, "
                  f"p50 {ratios[dtype]['p50_x']:.2f}x faster, p99 "
                  f"{ratios[dtype]['p99_x']:.2f}x faster")
    write_json_atomic(args.out, {
        "results": results, "ratios_vs_torchrec": ratios, "loadavg_before": before,
        "loadavg_after": after, "threads": args.threads, "candidates": args.candidates,
        "batch": BATCH, "model": f"{NUM_TABLES} x {ROWS} x {DIM}, dense {DENSE_ARCH}, "
        f"over {OVER_ARCH}", "seconds": time.perf_counter() - started,
        "cpu_count": os.cpu_count()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
