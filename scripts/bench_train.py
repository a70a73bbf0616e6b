"""DLRM training throughput on CPU: ctrctl against plain torch and TorchRec, in one run.

The same model (26 tables x 100,000 rows x dim 64, 13 dense features, dense arch 512,256,64,
dot interaction, over arch 512,256,1, one id per feature, batch 4096) and the same batches,
trained three ways:

* ``ctrctl``: :class:`ctrctl.modules.DLRM` on one FBGEMM TBE for all 26 tables, exact rowwise
  Adagrad fused into backward; fused Adagrad on the dense parameters. Where its time goes
  differs from TorchRec's: the dot interaction's backward is written out (one batched matmul
  where autograd through bmm takes two, no index_put); its output is padded with one zero column
  (415 -> 416, a GEMM-friendly width: the same model, the padded weights stay zero);
* ``torch-sparse``: the same DLRM (ctrctl's MLP and DotInteraction, unpadded) with 26
  ``nn.EmbeddingBag(sparse=True)`` and ``torch.optim.Adagrad`` on their sparse gradients,
  Adagrad on the dense parameters: what the embeddings cost without a fused kernel;
* ``torchrec``: TorchRec 1.8.0's DLRM and EmbeddingBagCollection under
  DistributedModelParallel at world size 1 (table_wise, fused rowwise Adagrad through
  ``apply_optimizer_in_backward``), Adagrad on the dense parameters. Skipped with a note when
  torchrec is not installed (it is a benchmark reference, never a ctrctl dependency).

Each step is forward + BCE loss + backward (with the fused embedding update) + dense optimizer
step, on fresh random batches made before timing. The implementations take turns in rounds
(a few steps each) so that load from other processes falls on all of them alike; the figure
is the median step time after warm-up, as samples/s, and ratios are against each reference.

Usage:
    python scripts/bench_train.py [--quick] [--steps 20] [--warmup 5] [--threads 2]
                                  [--out bench-out/train.json]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ctrctl.io import write_json_atomic
from ctrctl.modules import (
    DLRM,
    MLP,
    DotInteraction,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingOptimizerConfig,
    dlrm_loss,
)
from ctrctl.sparse import KeyedJaggedTensor

LR = 0.01
EPS = 1e-8
DENSE_FEATURES = 13


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small tables, few steps")
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per implementation")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--round", type=int, default=2, help="steps per turn")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--only", default="", help="comma-separated implementations")
    parser.add_argument("--out", type=Path, default=Path("bench-out/train.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.steps, args.warmup, args.round = 10_000, 6, 2, 2
    return args


# ---- data -----------------------------------------------------------------------------


def make_batches(
    n: int, tables: int, rows: int, batch: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(dense (B, 13), ids (tables * B,) key-major, labels (B,)) per step, uniform ids."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        dense = torch.rand(batch, DENSE_FEATURES, generator=gen)
        ids = torch.randint(0, rows, (tables * batch,), generator=gen)
        labels = torch.randint(0, 2, (batch,), generator=gen).float()
        out.append((dense, ids, labels))
    return out


# ---- the three trainers: each returns a step(batch_index) function ---------------------


def ctrctl_trainer(args: argparse.Namespace, batches: list[Any]) -> Callable[[int], None]:
    keys = [f"C{i}" for i in range(args.tables)]
    configs = [EmbeddingBagConfig(f"t_{k}", args.rows, args.dim, [k]) for k in keys]
    ebc = EmbeddingBagCollection(
        configs,
        optimizer=EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=LR, eps=EPS),
        backend="auto",
    )
    model = DLRM(ebc, DENSE_FEATURES, [512, 256, args.dim], [512, 256, 1])
    optimizer = torch.optim.Adagrad(model.dense_parameters(), lr=LR, fused=True)
    lengths = torch.ones(args.tables * args.batch_size, dtype=torch.long)
    offsets = torch.arange(args.tables * args.batch_size + 1)
    kjts = [
        KeyedJaggedTensor(keys, ids, lengths=lengths, offsets=offsets, stride=args.batch_size)
        for _, ids, _ in batches
    ]

    def step(i: int) -> None:
        dense, _, labels = batches[i]
        loss = dlrm_loss(model(dense, kjts[i]), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step.backends = ebc.backends()  # type: ignore[attr-defined]
    return step


class SparseEmbeddingDLRM(nn.Module):
    """The same DLRM with one nn.EmbeddingBag(sparse=True) per table."""

    def __init__(self, tables: int, rows: int, dim: int) -> None:
        super().__init__()
        self.bags = nn.ModuleList(
            nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in range(tables)
        )
        bound = (1.0 / rows) ** 0.5
        for bag in self.bags:
            nn.init.uniform_(bag.weight, -bound, bound)
        self.dense_arch = MLP(DENSE_FEATURES, [512, 256, dim])
        self.interaction = DotInteraction(tables)
        self.over_arch = MLP(
            self.interaction.output_dim(dim), [512, 256, 1], final_activation=False
        )
        self.tables, self.dim = tables, dim

    def forward(
        self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        batch = dense.size(0)
        per_table = ids.view(self.tables, batch)
        pooled = torch.stack(
            [bag(per_table[t], offsets) for t, bag in enumerate(self.bags)], dim=1
        )  # (B, T, D)
        x = self.interaction(self.dense_arch(dense), pooled)
        return self.over_arch(x).squeeze(1)


def torch_sparse_trainer(args: argparse.Namespace, batches: list[Any]) -> Callable[[int], None]:
    model = SparseEmbeddingDLRM(args.tables, args.rows, args.dim)
    sparse_params = list(model.bags.parameters())
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("bags.")]
    sparse_opt = torch.optim.Adagrad(sparse_params, lr=LR, eps=EPS)
    dense_opt = torch.optim.Adagrad(dense_params, lr=LR)
    offsets = torch.arange(args.batch_size)

    def step(i: int) -> None:
        dense, ids, labels = batches[i]
        loss = F.binary_cross_entropy_with_logits(model(dense, ids, offsets), labels)
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()

    return step


def torchrec_trainer(args: argparse.Namespace, batches: list[Any]) -> Callable[[int], None]:
    import torch.distributed as dist
    import torchrec  # noqa: F401
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from torchrec.distributed.types import ShardingEnv
    from torchrec.models.dlrm import DLRM as TorchRecDLRM
    from torchrec.modules.embedding_configs import EmbeddingBagConfig as TrecConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection as TrecEBC
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor as TrecKJT

    # TorchRec's planner and DDP warn about a CPU topology built by hand; not our concern here.
    logging.getLogger("torchrec").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="torchrec")
    warnings.filterwarnings("ignore", category=FutureWarning)
    if not dist.is_initialized():
        from ctrctl.distributed.processes import free_port

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    keys = [f"C{i}" for i in range(args.tables)]
    configs = [
        TrecConfig(
            name=f"t_{k}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[k]
        )
        for k in keys
    ]
    model = TorchRecDLRM(
        embedding_bag_collection=TrecEBC(tables=configs, device=torch.device("meta")),
        dense_in_features=DENSE_FEATURES,
        dense_arch_layer_sizes=[512, 256, args.dim],
        over_arch_layer_sizes=[512, 256, 1],
        dense_device=torch.device("cpu"),
    )
    apply_optimizer_in_backward(
        RowWiseAdagrad, model.sparse_arch.parameters(), {"lr": LR, "eps": EPS}
    )
    constraints = {f"t_{k}": ParameterConstraints(sharding_types=["table_wise"]) for k in keys}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints
    )
    pg = dist.group.WORLD
    plan = planner.collective_plan(model, [EmbeddingBagCollectionSharder()], pg)
    dmp = DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"), plan=plan
    )
    dense_opt = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=LR),
    )
    lengths = torch.ones(args.tables * args.batch_size, dtype=torch.long)
    kjts = [TrecKJT(keys=keys, values=ids, lengths=lengths) for _, ids, _ in batches]

    def step(i: int) -> None:
        dense, _, labels = batches[i]
        logits = dmp(dense, kjts[i]).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()

    return step


# ---- timing --------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    n = args.warmup + args.steps
    batches = make_batches(n, args.tables, args.rows, args.batch_size)
    builders: dict[str, Callable[[argparse.Namespace, list[Any]], Callable[[int], None]]] = {
        "ctrctl": ctrctl_trainer,
        "torch-sparse": torch_sparse_trainer,
        "torchrec": torchrec_trainer,
    }
    wanted = [name for name in args.only.split(",") if name] or list(builders)
    notes: dict[str, str] = {}
    steps: dict[str, Callable[[int], None]] = {}
    for name in wanted:
        if name == "torchrec":
            try:
                import torchrec  # noqa: F401
            except Exception as exc:  # ImportError, or an fbgemm mismatch inside torchrec
                notes[name] = (
                    f"skipped: torchrec is not importable ({exc}); install it for the benchmark "
                    "only: pip install --no-deps torchrec==1.8.0 && pip install tensordict tqdm "
                    "pyre-extensions iopath"
                )
                continue
        steps[name] = builders[name](args, batches)
        gc.collect()
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu_times: dict[str, list[float]] = {name: [] for name in steps}
    position = dict.fromkeys(steps, 0)
    while any(position[name] < n for name in steps):
        for name, step in steps.items():
            for _ in range(args.round):
                i = position[name]
                if i >= n:
                    break
                start, cpu_start = time.perf_counter(), time.process_time()
                step(i)
                elapsed = time.perf_counter() - start
                if i >= args.warmup:
                    times[name].append(elapsed)
                    cpu_times[name].append(time.process_time() - cpu_start)
                position[name] = i + 1
    results: dict[str, Any] = {}
    for name, values in times.items():
        median = statistics.median(values)
        results[name] = {
            "median_step_ms": median * 1000,
            "samples_per_s": args.batch_size / median,
            "step_ms": [v * 1000 for v in values],
            # Process CPU time (all threads): steadier than wall time on a shared machine.
            "median_cpu_ms": statistics.median(cpu_times[name]) * 1000,
        }
    if "ctrctl" in steps:
        results["ctrctl"]["embedding_backends"] = getattr(steps["ctrctl"], "backends", [])
        for ref in ("torch-sparse", "torchrec"):
            if ref in results:
                results["ctrctl"][f"ratio_vs_{ref}"] = (
                    results["ctrctl"]["samples_per_s"] / results[ref]["samples_per_s"]
                )
    return {
        "benchmark": "train",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "torch": torch.__version__,
        "results": results,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(
        f"DLRM training, {args.tables} tables x {args.rows:,} rows x dim {args.dim}, batch "
        f"{args.batch_size}, {args.threads} threads, median of {args.steps} steps after "
        f"{args.warmup} warm-up"
    )
    print(
        f"{'implementation':<14} {'step ms':>9} {'samples/s':>11} {'ctrctl ratio':>13} "
        f"{'cpu ms':>8}"
    )
    ctrctl = report["results"].get("ctrctl")
    for name, r in report["results"].items():
        ratio = ctrctl["samples_per_s"] / r["samples_per_s"] if ctrctl else float("nan")
        print(
            f"{name:<14} {r['median_step_ms']:>9.1f} {r['samples_per_s']:>11,.0f} {ratio:>12.2f}x"
        )
    for name, note in report["notes"].items():
        print(f"{name}: {note}")
    write_json_atomic(args.out, report)
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
