"""DLRM training throughput on CPU: ctrctl against TorchRec and plain torch, in one run.

The same model (26 tables x 100,000 rows x dim 64, 13 dense features, dense arch 512,256,64,
dot interaction, over arch 512,256,1, one id per feature, batch 4096) and the same batches,
trained by:

* ``ctrctl``: :class:`ctrctl.modules.DLRM` on one embedding kernel for all 26 tables (the one
  ``backend="auto"`` picks: the native C kernel on CPU), exact row-wise Adagrad fused into
  backward; fused Adagrad on the dense parameters. Its MLPs run where ``kernel="auto"`` puts
  them: ctrctl's own GEMM on AMD CPUs, torch's ``nn.Linear`` (MKL) elsewhere. The dot
  interaction's backward is written out and its output padded to 416 columns (the same
  model: the padded weights stay zero);
* ``ctrctl-bf16``: the same model object with bf16 autocast on its dense part (MLPs and
  interaction; fp32 master weights and embeddings), where the CPU has AMX-BF16/AVX512-BF16;
* ``torch-sparse``: the same DLRM (ctrctl's MLP and DotInteraction on torch's ops, unpadded)
  with 26 ``nn.EmbeddingBag(sparse=True)`` and ``torch.optim.Adagrad`` on their sparse
  gradients, Adagrad on the dense parameters: the plain-torch reference;
* ``torchrec``: TorchRec 1.8.0's DLRM and EmbeddingBagCollection under
  DistributedModelParallel at world size 1 (table_wise, fused row-wise Adagrad through
  ``apply_optimizer_in_backward``), Adagrad on the dense parameters. Skipped with a note when
  torchrec is not installed (a benchmark reference, never a ctrctl dependency:
  ``make bench-setup``).

Each step is forward + BCE loss + backward (with the fused embedding update) + dense optimizer
step, on random batches made before timing: uniform ids, and Zipf(1.1) ids (rank r drawn with
probability ~ r^-1.1, ranks scattered over the rows by a fixed permutation per table: hot rows
repeat inside a batch, where a kernel that sums each row's gradient once gains). Every setting
(threads x ids) runs the implementations in turns of a few steps each, so load from other
processes falls on all of them alike; the figure is the median step time after warm-up, as
samples/s, and each ratio is taken within one repeat. ``--repeats`` runs the whole matrix
again: reported are the median over repeats and the spread (min-max).

``--parquet`` adds the model trained through ``ctrctl.train`` on a synthetic Parquet dataset
(26 sparse features hashed to 100,000, loading and the loader's threads included), timed
against TorchRec's raw step in the same run. Its rate is the steps after
``--parquet-warmup`` ones (the first step advises the tables onto huge pages, seconds for
666 MB), from the run's own log entries; the whole call's rate (those first steps and the
final validation included) is reported beside it.

Usage:
    python scripts/bench_train.py [--quick] [--steps 8] [--warmup 2] [--threads 2,1]
                                  [--ids uniform,zipf] [--repeats 3] [--parquet]
                                  [--out bench-out/train.json] [--json PATH]

``--json PATH`` also writes the table ``scripts/render_performance.py`` reads
(``benchmarks/results/<cpu>/train.json``: the command, date, CPU model and load average).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from render_performance import add_json_argument, write_result
from torch import nn

from ctrctl.compat import bf16_autocast_supported
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
from ctrctl.modules.mlp import native_dense_preferred
from ctrctl.sparse import KeyedJaggedTensor

LR = 0.01
EPS = 1e-8
DENSE_FEATURES = 13
ZIPF_EXPONENT = 1.1
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # dense (B, 13), ids (T * B,), labels
Step = Callable[[Batch], None]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small tables, few steps")
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per setting")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per setting")
    parser.add_argument("--round", type=int, default=2, help="steps per turn")
    parser.add_argument("--threads", default="2,1", help="comma-separated thread counts")
    parser.add_argument("--ids", default="uniform,zipf", help="uniform and/or zipf")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the whole matrix")
    parser.add_argument("--only", default="", help="comma-separated implementations")
    parser.add_argument("--parquet", action="store_true",
                        help="also train through ctrctl.train on a Parquet dataset")
    parser.add_argument("--parquet-steps", type=int, default=24,
                        help="timed steps of ctrctl.train")
    parser.add_argument("--parquet-warmup", type=int, default=6,
                        help="steps of ctrctl.train before its timed ones")
    parser.add_argument("--out", type=Path, default=Path("bench-out/train.json"))
    add_json_argument(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.steps, args.warmup, args.repeats = 10_000, 4, 1, 1
        args.batch_size, args.parquet_steps, args.parquet_warmup = 1024, 4, 2
    args.thread_counts = [int(t) for t in args.threads.split(",") if t]
    args.id_kinds = [k for k in args.ids.split(",") if k]
    return args


# ---- data -----------------------------------------------------------------------------


def zipf_ids(tables: int, rows: int, batch: int, gen: torch.Generator,
             permutations: list[torch.Tensor]) -> torch.Tensor:
    """(tables * batch,) ids, feature-major: Zipf(1.1) ranks mapped through a fixed
    permutation of each table's rows."""
    ranks = torch.arange(1, rows + 1, dtype=torch.float64)
    cdf = torch.cumsum(ranks ** -ZIPF_EXPONENT, 0)
    cdf /= cdf[-1].clone()
    u = torch.rand(tables, batch, generator=gen, dtype=torch.float64)
    drawn = torch.searchsorted(cdf, u).clamp_(max=rows - 1)  # (T, B) ranks
    return torch.stack([permutations[t][drawn[t]] for t in range(tables)]).reshape(-1)


def make_batches(n: int, tables: int, rows: int, batch: int, kind: str = "uniform",
                 seed: int = 0) -> list[Batch]:
    """(dense (B, 13), ids (tables * B,) key-major, labels (B,)) per step."""
    gen = torch.Generator().manual_seed(seed)
    permutations = [torch.randperm(rows, generator=gen) for _ in range(tables)]
    out = []
    for _ in range(n):
        dense = torch.rand(batch, DENSE_FEATURES, generator=gen)
        if kind == "zipf":
            ids = zipf_ids(tables, rows, batch, gen, permutations)
        else:
            ids = torch.randint(0, rows, (tables * batch,), generator=gen)
        labels = torch.randint(0, 2, (batch,), generator=gen).float()
        out.append((dense, ids, labels))
    return out


def distinct_fraction(batches: list[Batch], tables: int) -> float:
    """Distinct (table, id) pairs over ids, averaged over batches."""
    values = []
    for _, ids, _ in batches:
        per_table = ids.view(tables, -1)
        distinct = sum(int(torch.unique(per_table[t]).numel()) for t in range(tables))
        values.append(distinct / ids.numel())
    return statistics.mean(values)


# ---- the trainers: each returns step(batch) --------------------------------------------


def ctrctl_trainer(args: argparse.Namespace, bf16: bool = False) -> Step:
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

    def step(batch: Batch, bf16: bool = bf16) -> None:
        dense, ids, labels = batch
        kjt = KeyedJaggedTensor(keys, ids, lengths=lengths, offsets=offsets,
                                stride=args.batch_size)
        model.dense_autocast = bf16
        loss = dlrm_loss(model(dense, kjt), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step.backends = ebc.backends()  # type: ignore[attr-defined]
    step.bf16_step = lambda batch: step(batch, True)  # type: ignore[attr-defined]
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
        # Plain torch: nn.Linear + nn.ReLU, and bmm for the interaction.
        self.dense_arch = MLP(DENSE_FEATURES, [512, 256, dim], kernel="torch")
        self.interaction = DotInteraction(tables, kernel="torch")
        self.over_arch = MLP(
            self.interaction.output_dim(dim), [512, 256, 1], final_activation=False,
            kernel="torch",
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


def torch_sparse_trainer(args: argparse.Namespace) -> Step:
    model = SparseEmbeddingDLRM(args.tables, args.rows, args.dim)
    sparse_params = list(model.bags.parameters())
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("bags.")]
    sparse_opt = torch.optim.Adagrad(sparse_params, lr=LR, eps=EPS)
    dense_opt = torch.optim.Adagrad(dense_params, lr=LR)
    offsets = torch.arange(args.batch_size)

    def step(batch: Batch) -> None:
        dense, ids, labels = batch
        loss = F.binary_cross_entropy_with_logits(model(dense, ids, offsets), labels)
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()

    return step


def torchrec_trainer(args: argparse.Namespace) -> Step:
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

    def step(batch: Batch) -> None:
        dense, ids, labels = batch
        kjt = TrecKJT(keys=keys, values=ids, lengths=lengths)
        logits = dmp(dense, kjt).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()

    return step


def build_steps(args: argparse.Namespace, notes: dict[str, str]) -> dict[str, Step]:
    wanted = [n for n in args.only.split(",") if n] or [
        "ctrctl", "ctrctl-bf16", "torchrec", "torch-sparse"]
    steps: dict[str, Step] = {}
    ctrctl_step: Step | None = None
    for name in wanted:
        if name in ("ctrctl", "ctrctl-bf16"):
            if name == "ctrctl-bf16" and not bf16_autocast_supported("cpu"):
                notes[name] = "skipped: this CPU has no AMX-BF16/AVX512-BF16"
                continue
            if ctrctl_step is None:
                ctrctl_step = ctrctl_trainer(args)  # one model: bf16 toggles its autocast
            steps[name] = ctrctl_step if name == "ctrctl" else ctrctl_step.bf16_step  # type: ignore[attr-defined]
        elif name == "torchrec":
            try:
                import torchrec  # noqa: F401
            except Exception as exc:  # ImportError, or an fbgemm mismatch inside torchrec
                notes[name] = (
                    f"skipped: torchrec is not importable ({exc}); install it for the benchmark "
                    "only: make bench-setup"
                )
                continue
            steps[name] = torchrec_trainer(args)
        elif name == "torch-sparse":
            steps[name] = torch_sparse_trainer(args)
        else:
            raise SystemExit(f"unknown implementation {name!r}")
        gc.collect()
    if ctrctl_step is not None:
        notes["ctrctl embedding kernel"] = ",".join(ctrctl_step.backends)  # type: ignore[attr-defined]
        notes["ctrctl dense layers"] = (
            "ctrctl's GEMM (_dense_kernel.c)" if native_dense_preferred() else "torch's")
    return steps


# ---- timing --------------------------------------------------------------------------


def time_setting(steps: dict[str, Step], batches: list[Batch], args: argparse.Namespace,
                 cpu: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Median step seconds per implementation, the implementations taking turns; the median
    process CPU seconds per step (all threads) are appended to ``cpu``."""
    n = args.warmup + args.steps
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
                step(batches[i])
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - start)
                    cpu_times[name].append(time.process_time() - cpu_start)
                position[name] = i + 1
    if cpu is not None:
        for name, values in cpu_times.items():
            cpu.setdefault(name, []).append(statistics.median(values))
    return {name: statistics.median(values) for name, values in times.items()}


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def run(args: argparse.Namespace) -> dict[str, Any]:
    notes: dict[str, str] = {}
    steps = build_steps(args, notes)
    n = args.warmup + args.steps
    batch_sets = {kind: make_batches(n, args.tables, args.rows, args.batch_size, kind)
                  for kind in args.id_kinds}
    distinct = {kind: distinct_fraction(b, args.tables) for kind, b in batch_sets.items()}
    # samples/s per (setting, implementation), one value per repeat
    rates: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}  # CPU seconds per step, per repeat
    loads: list[str] = [loadavg()]
    for _ in range(args.repeats):
        for threads in args.thread_counts:
            torch.set_num_threads(threads)
            for kind in args.id_kinds:
                setting = f"{threads} threads, {kind} ids"
                medians = time_setting(steps, batch_sets[kind], args, cpu.setdefault(setting, {}))
                for name, seconds in medians.items():
                    rates.setdefault(setting, {}).setdefault(name, []).append(
                        args.batch_size / seconds)
        loads.append(loadavg())
    results: dict[str, Any] = {}
    for setting, per_impl in rates.items():
        entry: dict[str, Any] = {name: summary(v) for name, v in per_impl.items()}
        ratios: dict[str, Any] = {}
        for name in ("ctrctl", "ctrctl-bf16"):
            for ref in ("torchrec", "torch-sparse", "ctrctl"):
                if name in per_impl and ref in per_impl and ref != name:
                    ratios[f"{name} / {ref}"] = summary(
                        [a / b for a, b in zip(per_impl[name], per_impl[ref], strict=True)])
        entry["ratios"] = ratios
        # CPU time per step (all threads): less sensitive than wall time to other processes
        # on a shared machine; the ratio of CPU seconds per sample, within each repeat.
        entry["cpu_ms_per_step"] = {k: summary([1000 * x for x in v])
                                    for k, v in cpu[setting].items()}
        entry["cpu_ratios"] = {
            f"{name} / {ref}": summary([b / a for a, b in zip(cpu[setting][name],
                                                               cpu[setting][ref], strict=True)])
            for name in ("ctrctl", "ctrctl-bf16") for ref in ("torchrec", "torch-sparse")
            if name in cpu[setting] and ref in cpu[setting]}
        results[setting] = entry
    report: dict[str, Any] = {
        "benchmark": "train",
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "torch": torch.__version__,
        "distinct_id_fraction": distinct,
        "results": results,
        "loadavg": loads,
        "notes": notes,
    }
    if args.parquet:
        report["parquet"] = parquet_run(args, steps.get("torchrec"))
        report["loadavg"].append(loadavg())
    return report


# ---- the model through ctrctl.train on Parquet -----------------------------------------


def parquet_run(args: argparse.Namespace, torchrec_step: Step | None) -> dict[str, Any]:
    """ctrctl.train on a synthetic Criteo-format Parquet dataset (26 features hashed to
    ``--rows``), loading included, against TorchRec's raw step in the same minutes."""
    import ctrctl

    threads = args.thread_counts[0]
    torch.set_num_threads(threads)
    warmup, steps = args.parquet_warmup, args.parquet_steps
    rows = args.batch_size * (warmup + steps + 1)
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        root = Path(tmp)
        ctrctl.synthesize(root / "logs", rows=int(rows / 0.8) + 1)
        schema = Path("schemas/criteo.yaml").read_text()
        lines = []
        for line in schema.splitlines():
            if "role: sparse" in line and "hash_size:" in line:
                head = line.split("hash_size:")[0]
                line = f"{head}hash_size: {args.rows}}}"
            lines.append(line)
        (root / "schema.yaml").write_text("\n".join(lines) + "\n")
        ctrctl.preprocess(root / "schema.yaml",
                          [f"{s}={root / 'logs' / f'{s}.tsv'}" for s in ("train", "val")],
                          root / "dataset")
        # Log entries at the warm-up's end and at the last step (no validation between:
        # the run validates once, after the last entry).
        overrides = [
            f"model.embedding_dim={args.dim}", f"model.dense_arch=[512,256,{args.dim}]",
            "model.over_arch=[512,256,1]", f"training.batch_size={args.batch_size}",
            f"training.max_steps={warmup + steps}", "training.val_max_rows=4096",
            "training.val_every=0", f"training.log_every={warmup if warmup else steps}",
            "embedding_optimizer.lr=0.01",
        ]
        config = ctrctl.load_config(None, overrides)
        start = time.perf_counter()
        result = ctrctl.train(root / "dataset", root / "run", config)
        wall = time.perf_counter() - start
    out: dict[str, Any] = {
        "threads": threads,
        "warmup_steps": warmup,
        "steps": steps,
        "ctrctl_train_samples_per_s": timed_rate(result.history, warmup, args.batch_size),
        "ctrctl_train_whole_call_samples_per_s": result.samples_per_s,
        "ctrctl_train_wall_s_with_setup_and_validation": wall,
    }
    if torchrec_step is not None:
        batches = make_batches(args.warmup + args.steps, args.tables, args.rows,
                               args.batch_size, seed=5)
        seconds = time_setting({"torchrec": torchrec_step}, batches, args)["torchrec"]
        out["torchrec_samples_per_s"] = args.batch_size / seconds
        out["ratio"] = out["ctrctl_train_samples_per_s"] / out["torchrec_samples_per_s"]
    return out


def timed_rate(history: list[dict[str, Any]], warmup: int, batch_size: int) -> float:
    """samples/s between the log entry at step ``warmup`` and the last one: each entry's
    ``train.samples_per_s`` is the run's rate since its start, so the seconds to an entry
    are its samples over its rate."""
    entries = {e["step"]: e["train.samples_per_s"] for e in history
               if "train.samples_per_s" in e}
    last = max(entries)
    if warmup == 0 or warmup not in entries or last == warmup:
        return entries[last]
    seconds = {s: s * batch_size / entries[s] for s in (warmup, last)}
    return (last - warmup) * batch_size / (seconds[last] - seconds[warmup])


JSON_COLUMNS = ["case", "samples/s ctrctl / TorchRec / torch", "ctrctl / TorchRec",
                "ctrctl / torch", "bf16 / TorchRec"]


def result_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report as rows of the performance table (render_performance.py's format)."""
    def ratio(entry: dict[str, Any], key: str, spread: bool = False) -> str:
        r = entry["ratios"].get(key)
        if r is None:
            return "not run"
        return f"{r['median']:.2f}x" + (f" [{r['min']:.2f}-{r['max']:.2f}]" if spread else "")

    rows = []
    for setting, entry in report["results"].items():
        threads, kind = setting.split(" threads, ")
        case = f"{threads} thread{'s' if threads != '1' else ''}, " + (
            "Zipf(1.1) ids" if kind.startswith("zipf") else "uniform ids")
        rates = " / ".join(f"{entry[n]['median']:,.0f}" if n in entry else "-"
                           for n in ("ctrctl", "torchrec", "torch-sparse"))
        row: dict[str, Any] = {"values": {
            "case": case, JSON_COLUMNS[1]: rates,
            "ctrctl / TorchRec": ratio(entry, "ctrctl / torchrec", spread=True),
            "ctrctl / torch": ratio(entry, "ctrctl / torch-sparse"),
            "bf16 / TorchRec": ratio(entry, "ctrctl-bf16 / torchrec")}}
        if kind.startswith("uniform"):
            plural = "thread" if threads == "1" else "threads"
            row["headline"] = {"label": f"Training, {threads} {plural} (uniform ids) vs TorchRec",
                               "column": "ctrctl / TorchRec"}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(
        f"DLRM training, {args.tables} tables x {args.rows:,} rows x dim {args.dim}, batch "
        f"{args.batch_size}; median over {args.repeats} repeats of the median of "
        f"{args.steps} steps after {args.warmup} warm-up; [min-max] over repeats"
    )
    for setting, entry in report["results"].items():
        print(f"-- {setting}")
        for name, r in entry.items():
            if name not in ("ratios", "cpu_ratios", "cpu_ms_per_step"):
                print(f"   {name:<14} {r['median']:>10,.0f} samples/s "
                      f"[{r['min']:,.0f}-{r['max']:,.0f}]")
        for name, r in entry["ratios"].items():
            print(f"   {name:<28} {r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]")
        for name, r in entry["cpu_ratios"].items():
            print(f"   by CPU time {name:<16} {r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]")
    print(f"distinct ids per batch: {report['distinct_id_fraction']}")
    if "parquet" in report:
        print(f"ctrctl.train on Parquet: {report['parquet']}")
    for name, note in report["notes"].items():
        print(f"{name}: {note}")
    print(f"loadavg: {report['loadavg']}")
    write_json_atomic(args.out, report)
    print(f"results in {args.out}")
    if args.json:
        cfg = report["config"]
        write_result(
            args.json, "train", "Training: DLRM on CPU (`scripts/bench_train.py`)",
            f"{cfg['tables']} tables x {cfg['rows']:,} x {cfg['dim']}, batch {cfg['batch_size']}; "
            "samples/s as median over repeats, ratios within each repeat [min-max]. Columns: "
            "ctrctl / TorchRec 1.8.0 / plain torch (nn.EmbeddingBag(sparse)).",
            JSON_COLUMNS, result_rows(report), load_before=report["loadavg"][0].split()[0])
        print(f"performance table in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
