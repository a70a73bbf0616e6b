"""How far any model gets on a shared sample's split: the spread the tuning targets sit in.

For each split seed S (``preprocess --seed S`` draws the val split carved from train, as in
``scripts/tune_samples.py``), on the test split:

- **defaults, K training seeds**: ``ctrctl train`` with no config and ``training.seed`` S,
  S + 10, ..., S + 10 (K - 1): each run's test AUC (their mean and range: what one study seed
  of the tuning protocol can land on with the settings unchanged);
- **their ensemble**: the mean of the K runs' predicted probabilities (what averaging the
  training noise away is worth);
- **logistic regression on the same ids**: one weight per (feature, id) and a bias, L2
  penalty chosen on the val split from a small grid, fitted to convergence with L-BFGS: an
  independent reference on exactly the features the DLRM sees (test read once, for the
  chosen penalty).

Test AUC's standard error (Hanley and McNeil) is printed beside them: it is the resolution
of any target on that split.

    python scripts/tune_ceiling.py --sets avazu --seeds 0 1 2 --runs 5 --json ceiling.json
    python scripts/tune_ceiling.py --sets movielens --runs 3 --override model.interaction=dot

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

import numpy as np
import polars as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_samples import REPO, SETS, _cli, prepare  # noqa: E402

from ctrctl.metrics.functional import roc_auc  # noqa: E402
from ctrctl.modules.native import cpu_model  # noqa: E402

#: L2 penalties (per row of the training loss) the regression chooses from on val.
PENALTIES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["avazu"], choices=sorted(SETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--runs", type=int, default=5, help="training seeds per split seed")
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=Path("runs/tune-ceiling"))
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every defaults run (repeatable), e.g. "
                        "model.interaction=dot")
    return parser.parse_args(argv)


def standard_error(auc: float, positives: int, negatives: int) -> float:
    """Hanley and McNeil's (1982) standard error of an AUC."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc)
           + (negatives - 1) * (q2 - auc * auc)) / (positives * negatives)
    return math.sqrt(var)


def _split(dataset: Path, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids (N, F) of the single-valued sparse features, dense (N, D), labels (N,))."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    frame = pl.concat([pl.read_parquet(dataset / f) for f in manifest["splits"][split]["files"]])
    sparse = [f["name"] for f in manifest["sparse"] if not f["multi_hot"]]
    dense = [f["name"] if isinstance(f, dict) else f for f in manifest["dense"]]
    values = frame.select(dense).to_numpy().astype(np.float64) if dense \
        else np.zeros((frame.height, 0))
    return frame.select(sparse).to_numpy().astype(np.int64), np.nan_to_num(values), \
        frame[manifest["label"]].to_numpy().astype(np.float64)


def logistic_reference(dataset: Path) -> dict[str, Any]:
    """L2 logistic regression on the dataset's ids (one weight per feature and id) and its
    dense values as they are stored: penalty chosen on val, AUC on test."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    sizes = np.array([f["num_embeddings"] for f in manifest["sparse"] if not f["multi_hot"]])
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)[:-1]]))
    (itr, dtr, ytr), (iva, dva, yva), (ite, dte, yte) = (
        _split(dataset, s) for s in ("train", "val", "test"))

    def logits(ids: np.ndarray, dense: np.ndarray, weight: torch.Tensor,
               dense_weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        rows = torch.from_numpy(ids) + offsets
        return weight[rows].sum(1) + torch.from_numpy(dense) @ dense_weight + bias

    fits = []
    for penalty in PENALTIES:
        weight = torch.zeros(int(sizes.sum()), dtype=torch.float64, requires_grad=True)
        dense_weight = torch.zeros(dtr.shape[1], dtype=torch.float64, requires_grad=True)
        bias = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        params = [weight, dense_weight, bias]
        solver = torch.optim.LBFGS(params, max_iter=500, tolerance_grad=1e-9,
                                   line_search_fn="strong_wolfe")

        def closure(penalty: float = penalty, params: list[torch.Tensor] = params,
                    solver: torch.optim.LBFGS = solver) -> torch.Tensor:
            solver.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits(itr, dtr, *params), torch.from_numpy(ytr)) \
                + penalty * (params[0].pow(2).sum() + params[1].pow(2).sum())
            loss.backward()
            return loss

        solver.step(closure)  # type: ignore[arg-type]
        with torch.no_grad():
            val_loss = float(torch.nn.functional.binary_cross_entropy_with_logits(
                logits(iva, dva, *params), torch.from_numpy(yva)))
        fits.append((val_loss, penalty, [p.detach() for p in params]))
    val_loss, penalty, params = min(fits, key=lambda f: f[0])
    test_scores = torch.sigmoid(logits(ite, dte, *params)).numpy()
    return {"penalty": penalty, "val_logloss": val_loss, "test_auc": roc_auc(yte, test_scores),
            "test_rows": len(yte), "test_clicks": int(yte.sum())}


def _predictions(checkpoint: Path, dataset: Path, out: Path) -> tuple[float, pl.DataFrame]:
    _cli(["eval", "--checkpoint", str(checkpoint), "--dataset", str(dataset), "--split",
          "test", "--out", str(out), "--no-track", "--no-baselines", "--overwrite",
          "--save-predictions"])
    auc = float(json.loads((out / "metrics.json").read_text())["auc"])
    return auc, pl.read_parquet(out / "predictions").sort("row")


def run_one(name: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    dataset = prepare(name, seed, args)
    work = dataset.parent
    singles, frames = [], []
    for k in range(args.runs):
        train_seed = seed + 10 * k
        out = work / f"defaults-t{train_seed}"
        _cli(["train", "--dataset", str(dataset), "--out", str(out), "--no-track", "--overwrite",
              f"training.seed={train_seed}", *args.override])
        auc, frame = _predictions(out, dataset, work / f"eval-t{train_seed}")
        singles.append(auc)
        frames.append(frame)
    labels = frames[0]["label"].to_numpy()
    mean_scores = np.mean([f["score"].to_numpy() for f in frames], axis=0)
    ensemble = roc_auc(labels, mean_scores)
    reference = logistic_reference(dataset)
    positives = int(labels.sum())
    se = standard_error(statistics.fmean(singles), positives, len(labels) - positives)
    return {"set": name, "seed": seed, "defaults_auc": singles,
            "defaults_mean": statistics.fmean(singles), "ensemble_auc": ensemble,
            "logistic": reference, "test_auc_se": se}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    rows = []
    for name in args.sets:
        for seed in args.seeds:
            row = run_one(name, seed, args)
            rows.append(row)
            print(f"{name} split seed {seed}: defaults {statistics.fmean(row['defaults_auc']):.4f}"
                  f" ({min(row['defaults_auc']):.4f}-{max(row['defaults_auc']):.4f} over "
                  f"{args.runs} training seeds), their ensemble {row['ensemble_auc']:.4f}, "
                  f"logistic regression {row['logistic']['test_auc']:.4f} (L2 "
                  f"{row['logistic']['penalty']:g}); test AUC standard error "
                  f"{row['test_auc_se']:.4f}", flush=True)
    for name in args.sets:
        mine = [r for r in rows if r["set"] == name]
        print(f"{name} means over split seeds {args.seeds}: defaults "
              f"{statistics.fmean(r['defaults_mean'] for r in mine):.4f}, ensembles "
              f"{statistics.fmean(r['ensemble_auc'] for r in mine):.4f}, logistic regression "
              f"{statistics.fmean(r['logistic']['test_auc'] for r in mine):.4f}")
    if args.json:
        args.json.write_text(json.dumps(
            {"cpu": cpu_model(), "load": [load_before, os.getloadavg()[0]],
             "seconds": time.perf_counter() - started, "args": sys.argv[1:], "rows": rows},
            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
