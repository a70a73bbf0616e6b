"""Managed collisions (zch) against hashing at equal memory, on synthetic days and MovieLens.

Synthetic days (``ctrctl.data.synthetic_days``): days 1-6 train, day 7 tests. Each seed
trains one DLRM per method, in data order (one pass, as a daily stream is trained), with
the user and item tables at ``--user-rows`` / ``--item-rows`` rows either way:

* ``hash``: ``key mod rows``;
* ``zch-lru`` / ``zch-lfu``: a managed-collision table of capacity ``rows`` (row 0 the
  shared default row).

Reported per method: test AUC and logloss (median, min-max over seeds), the share of test
lookups whose row is shared with another id seen (hashing's collision rate) or that go to
the default row (zch), and the share of distinct test ids with a row of their own.

MovieLens (``--movielens DIR`` with ``u.data``): ratings >= 4 are clicks, the first 85% of
the ratings in time order train, the rest test; user and item tables below their distinct
counts.

Usage:
    python scripts/zch_quality.py [--seeds 3] [--rows-per-day 20000] [--user-rows 4096]
        [--item-rows 1024] [--movielens ../shared/data/movielens-100k] [--out zch.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.data.manifest import DatasetManifest
from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema
from ctrctl.data.synthetic_days import days_schema, synthesize_days
from ctrctl.io import write_json_atomic
from ctrctl.metrics.functional import roc_auc
from ctrctl.models.build import dlrm_from_manifest
from ctrctl.modules import DLRM, EmbeddingOptimizerConfig, dlrm_loss

METHODS = ("hash", "zch-lru", "zch-lfu")
TABLES = ("user", "item")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--rows-per-day", type=int, default=20_000)
    p.add_argument("--new-ids-per-day", type=int, default=2_000)
    p.add_argument("--popularity-drift", type=float, default=0.3)
    p.add_argument("--user-rows", type=int, default=4096)
    p.add_argument("--item-rows", type=int, default=1024)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--movielens", type=Path, default=None)
    p.add_argument("--out", type=Path, default=Path("bench-out/zch_quality.json"))
    return p.parse_args(argv)


def table_keys(method: str, rows: int) -> dict[str, Any]:
    if method == "hash":
        return {"hash_size": rows}
    return {"collision": {"kind": "zch", "capacity": rows, "eviction": method.split("-")[1]}}


def train_and_test(dataset: Path, args: argparse.Namespace, seed: int) -> tuple[DLRM, dict]:
    """One pass over train in file (= time) order, then scores of test."""
    torch.manual_seed(seed)
    manifest = DatasetManifest.load(dataset)
    model = dlrm_from_manifest(manifest, args.dim, [], [32, 1], seed=seed,
                               optimizer=EmbeddingOptimizerConfig(lr=args.lr))
    dense_opt = torch.optim.Adagrad(list(model.dense_parameters()), lr=args.lr)
    model.train()
    for batch in BatchLoader(dataset, "train", args.batch, shuffle=False, num_workers=1):
        loss = dlrm_loss(model(batch.dense, batch.sparse), batch.labels)
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
    model.eval()
    scores, labels = [], []
    with torch.no_grad():
        for batch in BatchLoader(dataset, "test", 4096, shuffle=False, cover_all=True,
                                 num_workers=1):
            scores.append(torch.sigmoid(model(batch.dense, batch.sparse)))
            labels.append(batch.labels)
    p = torch.cat(scores).double().clamp(1e-7, 1 - 1e-7).numpy()
    y = torch.cat(labels).numpy()
    logloss = float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
    return model, {"auc": roc_auc(y, p.astype(np.float32)), "logloss": logloss}


def own_rows(dataset: Path, model: DLRM) -> dict[str, float]:
    """Per zch table: share of test lookups on the default row, share of test ids owning one."""
    manifest = DatasetManifest.load(dataset)
    test = pl.concat([pl.read_parquet(dataset / f) for f in manifest.split("test").files])
    mc = model.collisions
    assert mc is not None
    out: dict[str, float] = {}
    for name in TABLES:
        remapper = mc.remappers[name]
        test_ids = torch.from_numpy(test[name].to_numpy().copy())
        slots = remapper.remap(test_ids, update=False)
        out[f"{name}_default_rate"] = float((slots == 0).double().mean())
        owned = remapper.lookup(torch.unique(test_ids)) >= 0
        out[f"{name}_own_row_share"] = float(owned.double().mean())
    return out


def hash_rows(raw_dataset: Path, rows: dict[str, int]) -> dict[str, float]:
    """Hashing's collisions, from the raw keys of the same rows (the zch dataset)."""
    manifest = DatasetManifest.load(raw_dataset)
    frames = {s: pl.concat([pl.read_parquet(raw_dataset / f) for f in manifest.split(s).files])
              for s in ("train", "test")}
    out: dict[str, float] = {}
    for name in TABLES:
        seen = np.unique(np.concatenate([frames[s][name].to_numpy() for s in frames]))
        buckets = seen % rows[name]
        ids_per_row = np.bincount(buckets, minlength=rows[name])
        test_ids = frames["test"][name].to_numpy()
        shared = ids_per_row[test_ids % rows[name]] > 1
        out[f"{name}_collision_rate"] = float(shared.mean())
        distinct = np.unique(test_ids)
        out[f"{name}_own_row_share"] = float((ids_per_row[distinct % rows[name]] == 1).mean())
    return out


def run_case(raw: dict[str, list[Path]], schema_of: Any, args: argparse.Namespace,
             rows: dict[str, int], seed: int, work: Path) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    inputs = [f"train={p}" for p in raw["train"]] + [f"test={p}" for p in raw["test"]]
    for method in METHODS:
        folder = work / f"{method}-{seed}"
        schema = Schema.from_dict(schema_of(method))
        preprocess(schema, inputs, folder, val_fraction=0.0, overwrite=True)
        t0 = time.perf_counter()
        model, metrics = train_and_test(folder, args, seed)
        metrics["seconds"] = time.perf_counter() - t0
        if method != "hash":
            metrics.update(own_rows(folder, model))
            assert model.collisions is not None
            for name, stats in model.collisions.stats().items():
                metrics[f"{name}_evictions"] = stats["evictions"]
        results[method] = metrics
    results["hash"].update(hash_rows(work / f"zch-lru-{seed}", rows))
    return results


def movielens_files(folder: Path, work: Path) -> dict[str, list[Path]]:
    """u.data (user, item, rating, time) -> train/test CSVs in time order."""
    frame = pl.read_csv(folder / "u.data", separator="\t", has_header=False,
                        new_columns=["user", "item", "rating", "time"]).sort("time")
    frame = frame.with_columns((pl.col("rating") >= 4).cast(pl.Int64).alias("click"),
                               (pl.col("time") // 86_400).alias("day"))
    cut = int(frame.height * 0.85)
    out = {}
    for split, part in (("train", frame[:cut]), ("test", frame[cut:])):
        path = work / f"movielens_{split}.csv"
        part.select("click", "day", "user", "item").write_csv(path)
        out[split] = [path]
    return out


def movielens_schema(method: str, rows: dict[str, int]) -> dict[str, Any]:
    return {"name": "movielens", "format": "csv", "header": True, "label": "click",
            "columns": [{"name": "click", "role": "label"}, {"name": "day", "role": "ignore"},
                        {"name": "user", "role": "sparse", "type": "int",
                         **table_keys(method, rows["user"])},
                        {"name": "item", "role": "sparse", "type": "int",
                         **table_keys(method, rows["item"])}]}


def summarise(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for method in METHODS:
        keys = runs[0][method].keys()
        out[method] = {k: {"median": statistics.median(r[method][k] for r in runs),
                           "min": min(r[method][k] for r in runs),
                           "max": max(r[method][k] for r in runs)} for k in keys}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                              "cpu": _cpu(), "load_before": _load()}
    rows = {"user": args.user_rows, "item": args.item_rows}
    with tempfile.TemporaryDirectory(prefix="zch-quality-") as tmp:
        work = Path(tmp)
        runs = []
        for seed in range(args.seeds):
            logs = synthesize_days(work / f"days-{seed}", days=args.days,
                                   rows_per_day=args.rows_per_day,
                                   new_ids_per_day=args.new_ids_per_day,
                                   popularity_drift=args.popularity_drift, seed=seed)
            raw = {"train": [logs.files[d] for d in range(1, args.days)],
                   "test": [logs.files[args.days]]}
            runs.append(run_case(raw, lambda m: days_schema(table_keys(m, rows["user"]),
                                                            table_keys(m, rows["item"])),
                                 args, rows, seed, work))
            runs[-1]["best_auc_test"] = {"auc": logs.best_auc[args.days]}  # type: ignore
            print(f"seed {seed}: " + ", ".join(f"{m} auc {runs[-1][m]['auc']:.4f}"
                                             for m in METHODS), file=sys.stderr)
        report["synthetic"] = {"runs": runs, "summary": summarise(runs),
                               "distinct": logs.distinct}
        if args.movielens is not None and (args.movielens / "u.data").is_file():
            ml_rows = {"user": 512, "item": 1024}  # 943 users, 1682 items
            files = movielens_files(args.movielens, work)
            ml_runs = [run_case(files, lambda m: movielens_schema(m, ml_rows), args, ml_rows,
                                seed, work) for seed in range(args.seeds)]
            report["movielens"] = {"rows": ml_rows, "runs": ml_runs,
                                   "summary": summarise(ml_runs)}
    report["load_after"] = _load()
    write_json_atomic(args.out, report)
    for part in ("synthetic", "movielens"):
        if part in report:
            for method, s in report[part]["summary"].items():
                print(f"{part} {method}: AUC {s['auc']['median']:.4f} "
                      f"[{s['auc']['min']:.4f}, {s['auc']['max']:.4f}] logloss "
                      f"{s['logloss']['median']:.4f}")
    return 0


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


if __name__ == "__main__":
    sys.exit(main())

