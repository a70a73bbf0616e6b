"""The tuning protocol on the shared samples: defaults against ``ctrctl tune``, test AUC.

For each data set and study seed S: preprocess with ``--seed S`` (which draws the val split
carved from train), train the defaults (``training.seed=S``) and evaluate them on test; then
``ctrctl tune`` (TPE seeded S, at most --trials trials or --timeout-s seconds, judged on val
only) and evaluate ``DIR/best`` on test. Test is read by the two evals only.

The best trial is the one :mod:`ctrctl.tuning.recheck` keeps (finalists retrained on fresh
val samples); the trial with the best val metric alone is evaluated too when it differs
(``val_winner_test``). MovieLens-100k is a CTR task (rating >= 4 a click,
``schemas/movielens.yaml``), divided 80/10/10 at random.

The full protocol of issue 35 (30 trials or 15 minutes, 3 study seeds, 4 data sets)::

    python scripts/tune_samples.py --sets avazu criteo frappe movielens --seeds 0 1 2 \\
        --trials 30 --timeout-s 900 --work runs/tune-samples --json tune-samples.json

What fits two shared cores in about half an hour::

    nice -n 5 python scripts/tune_samples.py --sets avazu criteo --seeds 0 --trials 12 \\
        --timeout-s 600 --work /tmp/tune-samples --json tune-samples.json

Data: ``../shared/data`` relative to the repository (or --data).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ctrctl.modules.native import cpu_model

REPO = Path(__file__).resolve().parent.parent

#: name -> (schema, inputs relative to the data folder); SPLIT_ARGS: extra preprocess args
SETS: dict[str, tuple[str, list[str]]] = {
    "avazu": ("avazu_vocab.yaml", ["train=avazu-9k/train.csv", "test=avazu-9k/dev.csv",
                                   "test=avazu-9k/test.csv"]),
    "criteo": ("criteo_vocab.yaml", ["train=criteo-kaggle-8k/train.csv",
                                     "test=criteo-kaggle-8k/dev.csv",
                                     "test=criteo-kaggle-8k/test.csv"]),
    "frappe": ("frappe.yaml", ["train=frappe/frappe.validation.libfm",
                               "test=frappe/frappe.test.libfm"]),
    "movielens": ("movielens.yaml", ["movielens-100k/u.data"]),
}
#: MovieLens ships one file: 80% train, 10% val, 10% test at random (seeded by --seed).
SPLIT_ARGS: dict[str, list[str]] = {"movielens": ["--split-ratio", "0.8,0.1,0.1"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["avazu", "criteo"], choices=sorted(SETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--finalists", type=int, default=3,
                        help="finalists rechecked on fresh val samples (0: off)")
    parser.add_argument("--holdouts", type=int, default=2)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=Path("runs/tune-samples"))
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--bench-json", type=Path, default=None,
                        help="also write the table docs/performance.md renders "
                        "(benchmarks/results/<cpu>/tune.json)")
    return parser.parse_args(argv)


def write_bench(path: Path, rows: list[dict[str, Any]], load_before: str) -> None:
    """The per-set table of docs/performance.md: time per trial, pruned, test AUC."""
    sys.path.insert(0, str(REPO / "scripts"))
    from render_performance import write_result

    table = []
    for r in rows:
        counts = r["counts"]
        finished = counts.get("COMPLETE", 0) + counts.get("PRUNED", 0)
        table.append({"values": {
            "set (study seed)": f"{r['set']} ({r['seed']})",
            "trials (pruned)": f"{finished} ({counts.get('PRUNED', 0)})",
            "s per trial (median)": f"{r['seconds_per_trial']:.1f}",
            "search s": f"{r['tune_s']:.0f}",
            "test AUC defaults": f"{r['defaults']['auc']:.4f}",
            "test AUC tuned": f"{r['tuned']['auc']:.4f}"}})
    write_result(path, "tune", "Hyperparameter search: `ctrctl tune` on the shared samples "
                 "(`scripts/tune_samples.py`)",
                 "TPE + median pruner on the carved val split (10% of train), the default "
                 "space; test AUC of DIR/best against the defaults trained with the same "
                 "seed. One row per study (set and study seed); the spread is over the study seeds.",
                 list(table[0]["values"]), table, load_before)


def _cli(args: list[str]) -> None:
    from ctrctl.cli.app import main as ctrctl

    code = ctrctl(args)
    if code != 0:
        raise SystemExit(f"ctrctl {' '.join(args)} exited {code}")


def _test_auc(checkpoint: Path, dataset: Path, out: Path) -> dict[str, float]:
    _cli(["eval", "--checkpoint", str(checkpoint), "--dataset", str(dataset), "--split",
          "test", "--out", str(out), "--no-track", "--no-baselines", "--overwrite"])
    data = json.loads((out / "metrics.json").read_text())
    return {"auc": float(data["auc"]), "logloss": float(data["logloss"])}


def prepare(name: str, seed: int, args: argparse.Namespace) -> Path:
    """``args.work/NAME-sSEED/ds``: the set preprocessed with ``--seed SEED`` (the val split
    it carves from train), made once."""
    schema, inputs = SETS[name]
    dataset = args.work / f"{name}-s{seed}" / "ds"
    if not (dataset / "manifest.json").is_file():
        pre = ["preprocess", "--schema", str(REPO / "schemas" / schema), "--seed", str(seed),
               "--out", str(dataset), "--no-track"]
        for item in inputs:
            split, _, path = item.rpartition("=")
            pre += ["--input", f"{split}={args.data / path}" if split else str(args.data / path)]
        _cli([*pre, *SPLIT_ARGS.get(name, [])])
    return dataset


def run_one(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Defaults and the tuned best of one data set and seed."""
    from ctrctl.tuning import TuneRequest, tune

    dataset = prepare(name, seed, args)
    work = dataset.parent
    seed_override = [f"training.seed={seed}"] if seed else []
    started = time.perf_counter()
    _cli(["train", "--dataset", str(dataset), "--out", str(work / "defaults"), "--no-track",
          "--overwrite", *seed_override])
    default_s = time.perf_counter() - started
    defaults = _test_auc(work / "defaults", dataset, work / "defaults-eval")
    started = time.perf_counter()
    result = tune(TuneRequest(dataset=dataset, out=work / "tune", trials=args.trials,
                              timeout_s=args.timeout_s, seed=seed,
                              overrides=tuple(seed_override), finalists=args.finalists,
                              holdouts=args.holdouts))
    tune_s = time.perf_counter() - started
    assert result.best is not None
    tuned = _test_auc(result.best, dataset, work / "tuned-eval")
    complete = _complete(work / "tune")
    reverse = result.metric == "val.auc"
    winner = sorted(complete, key=lambda t: t["value"], reverse=reverse)[0]["number"]
    # what the search alone (the best val metric, no recheck) would have kept
    unchecked = tuned if winner == result.best_number else _test_auc(
        work / "tune" / "trials" / f"{winner:04d}", dataset, work / "val-winner-eval")
    return {"set": name, "seed": seed, "defaults": defaults, "tuned": tuned,
            "default_train_s": default_s, "tune_s": tune_s,
            "seconds_per_trial": result.seconds_per_trial, "counts": result.counts,
            "best_val": result.best_value, "best_trial": result.best_number,
            "best_params": result.best_params, "recheck": result.recheck,
            "val_winner": winner, "val_winner_test": unchecked}


def _complete(tune_dir: Path) -> list[dict[str, Any]]:
    import polars as pl

    table = pl.read_parquet(tune_dir / "trials.parquet")
    return table.filter(pl.col("state") == "COMPLETE").select("number", "value").to_dicts()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = f"{os.getloadavg()[0]:.2f}"
    rows = []
    for name in args.sets:
        for seed in args.seeds:
            row = run_one(name, seed, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for name in args.sets:
        mine = [r for r in rows if r["set"] == name]
        d = [r["defaults"]["auc"] for r in mine]
        t = [r["tuned"]["auc"] for r in mine]
        summary[name] = {"defaults_auc": statistics.fmean(d), "tuned_auc": statistics.fmean(t),
                         "tuned_auc_spread": (max(t) - min(t)) if len(t) > 1 else math.nan}
        print(f"{name}: test AUC defaults {summary[name]['defaults_auc']:.4f}, tuned "
              f"{summary[name]['tuned_auc']:.4f} over seeds {args.seeds}")
    if args.bench_json:
        write_bench(args.bench_json, rows, load_before)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_model(), "load": os.getloadavg(),
                                         "args": sys.argv[1:], "rows": rows,
                                         "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
