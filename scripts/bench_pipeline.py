"""Train pipelines at world size 2 on CPU with real Parquet loading: ctrctl vs TorchRec 1.8.0.

Both implementations train the same DLRM (``--tables`` tables x ``--rows`` rows x dim
``--dim``, 13 dense features, dense arch 512,256,dim, over arch 512,256,1, fused exact
rowwise Adagrad tables, Adagrad dense part) under the same plan (``--plan``, every table
the same type), on 2 gloo ranks with 1 intra-op thread each, reading the same synthetic
Parquet dataset through ctrctl's BatchLoader (one reader thread per rank). Measured,
each as global samples over the wall time of the timed steps (after warm-up):

* ctrctl: ``base``, ``sparse-dist`` and ``semi-sync`` (start step 0);
* TorchRec: its plain loop (forward, backward, step in turn) and its
  ``TrainPipelineSparseDist``.

Each runs with no delay and with ``--delay-ms`` (default 20) slept in the batch iterator
before every batch, as loading from remote storage would: a pipeline that loads ahead on a
thread hides it, a loop that loads in turn pays it. With ``--repeats`` the two
implementations' process pairs alternate; reported are medians, the spread (min-max), the
ratios of each repeat's pair, and the load average.

Usage:
    python scripts/bench_pipeline.py [--quick] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.io import write_json_atomic

CTRCTL = ["base", "sparse-dist", "semi-sync"]
TORCHREC = ["torchrec-base", "torchrec-sparse-dist"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model, a few steps")
    parser.add_argument("--tables", type=int, default=26)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2048, help="samples per rank")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--plan", default="table_wise", help="sharding type of every table")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-torchrec", action="store_true", help="ctrctl only")
    parser.add_argument("--out", type=Path, default=Path("bench-out/pipeline.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.tables, args.rows, args.dim, args.batch_size = 8, 5_000, 16, 512
        args.steps, args.warmup, args.repeats = 10, 3, 1
    return args


def _arch(cfg: dict[str, Any]) -> tuple[list[int], list[int]]:
    dim = cfg["dim"]
    return ([32, dim], [32, 1]) if cfg["quick"] else ([512, 256, dim], [512, 256, 1])


def _items(cfg: dict[str, Any], rank: int, delay_s: float) -> Iterator[tuple[int, Any]]:
    """This rank's batches from Parquet, each after ``delay_s`` of injected latency."""
    from ctrctl.data.dataset import BatchLoader

    loader = BatchLoader(cfg["dataset"], "train", cfg["batch_size"] * 2, rank=rank,
                         world_size=2, shuffle=True, seed=0, num_workers=1,
                         shuffle_buffer=65_536)
    epoch = 0
    n = 0
    while True:
        for batch in loader.epoch(epoch):
            if delay_s:
                time.sleep(delay_s)
            yield n, batch
            n += 1
        epoch += 1


def _run(progress: Any, items: Iterator[Any], cfg: dict[str, Any]) -> float:
    """Seconds for the timed steps, after warm-up (every rank starts together)."""
    for _ in range(cfg["warmup"]):
        progress(items)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(cfg["steps"]):
        progress(items)
    dist.barrier()
    return time.perf_counter() - start


def ctrctl_body(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, float]:
    from ctrctl.distributed import comm
    from ctrctl.distributed.default_plan import forced_plan
    from ctrctl.distributed.model_parallel import DistributedModelParallel
    from ctrctl.distributed.pipeline import make_pipeline
    from ctrctl.modules.dlrm import DLRM
    from ctrctl.modules.embedding_configs import EmbeddingBagConfig
    from ctrctl.modules.embedding_modules import EmbeddingBagCollection
    from ctrctl.modules.optimizers import EmbeddingOptimizerConfig

    tables = [EmbeddingBagConfig(f"t{i}", cfg["rows"], cfg["dim"], [f"C{i + 1}"])
              for i in range(cfg["tables"])]
    dense_arch, over_arch = _arch(cfg)
    model = DLRM(EmbeddingBagCollection(tables, EmbeddingOptimizerConfig(lr=0.01), seed=0),
                 13, dense_arch, over_arch)
    plan = forced_plan(tables, world_size, cfg["plan"], min_block_width=max(4, cfg["dim"] // 2))
    # semi-sync needs DDP on a group of its own; the others do not mind one
    dmp = DistributedModelParallel(model, plan,
                                   dense_process_group=comm.new_group(list(range(world_size))))
    opt = torch.optim.Adagrad(list(dmp.dense_parameters()), lr=0.01)
    out = {}
    for delay in (0.0, cfg["delay_s"]):
        for name in CTRCTL:
            kwargs = {"start_step": 0} if name == "semi-sync" else {}
            pipeline = make_pipeline(name, dmp, opt, torch.device("cpu"), **kwargs)
            items = _items(cfg, rank, delay)
            out[f"{name}@{delay * 1000:.0f}ms"] = _run(pipeline.progress, items, cfg)
            pipeline.close()
            items.close()
    return out


def torchrec_body(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, float]:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch as TorchrecBatch
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.models.dlrm import DLRM, DLRMTrain

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_sharding import torchrec_sharded  # the same TorchRec setup as that benchmark

    keys = [f"C{i + 1}" for i in range(cfg["tables"])]
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=cfg["rows"],
                                 embedding_dim=cfg["dim"], feature_names=[keys[i]])
              for i in range(cfg["tables"])]
    dense_arch, over_arch = _arch(cfg)
    model = DLRMTrain(DLRM(EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
                           13, dense_arch, over_arch))
    dmp, opt = torchrec_sharded(model, tables, cfg["plan"], cfg, world_size)

    def converted(items: Iterator[Any]) -> Iterator[Any]:
        for _, b in items:
            kjt = KeyedJaggedTensor(keys=b.sparse.keys(), values=b.sparse.values(),
                                    lengths=b.sparse.lengths())
            yield TorchrecBatch(dense_features=b.dense, sparse_features=kjt, labels=b.labels)

    def plain(batches: Iterator[Any]) -> None:
        loss, _ = dmp(next(batches))
        opt.zero_grad()
        loss.backward()
        opt.step()

    out = {}
    # the plain loop first: TorchRec's pipeline rewrites the model's forwards for good
    for delay in (0.0, cfg["delay_s"]):
        items = _items(cfg, rank, delay)
        out[f"torchrec-base@{delay * 1000:.0f}ms"] = _run(plain, converted(items), cfg)
        items.close()
    pipeline = TrainPipelineSparseDist(dmp, opt, torch.device("cpu"))
    for delay in (0.0, cfg["delay_s"]):
        items = _items(cfg, rank, delay)
        out[f"torchrec-sparse-dist@{delay * 1000:.0f}ms"] = _run(pipeline.progress,
                                                                  converted(items), cfg)
        items.close()
    return out


def _dataset(root: Path, cfg: dict[str, Any]) -> str:
    from ctrctl.testing.datasets import make_dataset

    rows = 2 * cfg["batch_size"] * (cfg["warmup"] + cfg["steps"] + 2)
    info = make_dataset(root / "ds", {"train": rows, "val": 1}, num_sparse=cfg["tables"],
                        num_embeddings=cfg["rows"], row_group_size=16_384, seed=0)
    return str(info.path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg: dict[str, Any] = {
        "tables": args.tables, "rows": args.rows, "dim": args.dim,
        "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup,
        "plan": args.plan, "delay_s": args.delay_ms / 1000, "quick": args.quick}
    impls = {"ctrctl": ctrctl_body}
    if not args.no_torchrec:
        try:
            import torchrec  # noqa: F401

            impls["torchrec"] = torchrec_body
        except ImportError:
            print("torchrec is not installed (make bench-setup): measuring ctrctl only")
    global_batch = 2 * args.batch_size
    rates: dict[str, list[float]] = {}
    loads = []
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        cfg["dataset"] = _dataset(Path(tmp), cfg)
        for r in range(args.repeats):
            for body in impls.values():
                seconds = run_multiprocess(body, 2, args=(cfg,), timeout_s=1200)
                for key in seconds[0]:
                    wall = max(s[key] for s in seconds)
                    rates.setdefault(key, []).append(global_batch * cfg["steps"] / wall)
            loads.append(Path("/proc/loadavg").read_text().strip())
            print(f"repeat {r + 1}/{args.repeats} done, load {loads[-1]}", flush=True)
    delay = f"{args.delay_ms:.0f}ms"
    rows = {}
    print(f"\n{'pipeline':<24}{'samples/s':>12}{'spread':>20}{f'@{delay} delay':>16}"
          f"{'kept':>8}   vs base (per repeat)")
    for name in CTRCTL + (TORCHREC if "torchrec" in impls else []):
        fast, slow = rates[f"{name}@0ms"], rates[f"{name}@{delay}"]
        base = rates["base@0ms"]
        ratios = [a / b for a, b in zip(fast, base, strict=True)]
        kept = [b / a for a, b in zip(fast, slow, strict=True)]
        rows[name] = {"samples_per_s": statistics.median(fast), "spread": [min(fast), max(fast)],
                      "delayed_samples_per_s": statistics.median(slow),
                      "kept_under_delay": statistics.median(kept),
                      "vs_base": statistics.median(ratios), "vs_base_each": ratios,
                      "all": fast, "all_delayed": slow}
        print(f"{name:<24}{rows[name]['samples_per_s']:>12,.0f}"
              f"{f'{min(fast):,.0f}-{max(fast):,.0f}':>20}"
              f"{rows[name]['delayed_samples_per_s']:>16,.0f}{rows[name]['kept_under_delay']:>8.0%}"
              f"   {rows[name]['vs_base']:.3f} ({', '.join(f'{x:.3f}' for x in ratios)})")
    if "torchrec" in impls:
        ours = [a / b for a, b in zip(rates["sparse-dist@0ms"],
                                      rates["torchrec-sparse-dist@0ms"], strict=True)]
        print(f"\nsparse-dist / TorchRec TrainPipelineSparseDist: {statistics.median(ours):.3f} "
              f"({', '.join(f'{x:.3f}' for x in ours)})")
        rows["sparse-dist_vs_torchrec"] = {"median": statistics.median(ours), "each": ours}
    print(f"load: {'; '.join(loads)}")
    write_json_atomic(args.out, {"config": {k: v for k, v in cfg.items() if k != "dataset"},
                                 "rows": rows, "loadavg": loads})
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
