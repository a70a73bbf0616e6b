"""Default training on synthetic logs of several sizes against the best AUC synth reports.

For each size: ``ctrctl synth --rows N`` (Criteo format, train/val/test = 0.8/0.1/0.1) ->
``ctrctl preprocess`` with the schema the README says to pick for that size (a vocabulary
schema, ``schemas/criteo_vocab.yaml``, up to a few million rows; ``schemas/criteo.yaml``'s
fixed hash sizes above) -> ``ctrctl train`` with no config and no overrides -> ``ctrctl eval
--split test``, all through the real CLI. Reported per size: test AUC, the best achievable
test AUC (the true click probabilities' AUC, from synth.json), the gap (target: under 0.01),
the sizes the defaults chose, why and when training stopped, and training samples/s (the
large case should keep the large-batch rate of scripts/bench_train.py).

Up to ``--oracle-up-to`` rows (default 1M) it also fits the planted structure itself: a
logistic regression told the click model's form (``ClickModel.planted``: one weight per
frequent rank of each feature with an effect, one per dense column's normal value ``z``,
one per frequent pair of the interacting features; L2 weight chosen on val) on the same
training rows. Its test AUC is what the rows can teach a model that knows the structure,
the ceiling no learner told less should expect to pass; the best AUC is the ceiling with
infinite rows.

Usage:
    python scripts/check_defaults_synth.py [--rows 10000,1000000,10000000] [--work DIR]
                                           [--oracle-up-to 1000000]
                                           [--out bench-out/defaults_synth.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.cli.app import main as ctrctl
from ctrctl.data.synthetic import DEFAULT_SPLITS, split_rows
from ctrctl.data.synthetic_model import CHUNK_ROWS, click_model
from ctrctl.io import write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
VOCAB_UP_TO = 3_000_000  # the README: vocabularies up to a few million rows, hashing above


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="10000,1000000,10000000",
                        help="comma-separated total rows (all splits) per case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("bench-out/defaults-synth"),
                        help="scratch folder (emptied per case)")
    parser.add_argument("--oracle-up-to", type=int, default=1_000_000,
                        help="fit the planted structure for cases up to this many rows "
                             "(0: never; 1M rows take a few minutes)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/defaults_synth.json"))
    return parser.parse_args(argv)


def planted_design(rows: int, seed: int) -> tuple[Any, np.ndarray]:
    """The planted structure's design matrix (CSR, rows x weights) and labels of all rows
    ``synth --rows rows --seed seed`` writes (Criteo format, every split in file order)."""
    import scipy.sparse as sp

    model = click_model("criteo", seed)
    blocks, labels = [], []
    for chunk, start in enumerate(range(0, rows, CHUNK_ROWS)):
        n = min(CHUNK_ROWS, rows - start)
        planted = model.planted(chunk, start, n, rows)
        every = np.arange(n)
        parts = [sp.csr_matrix(planted.z[d.name][:, None]) for d in model.spec.dense if d.effect]
        for feature in model.features:
            if feature.spec.effect:
                head = len(feature.effects) - 1  # frequent ranks; the rest share one weight
                rank = np.minimum(planted.ranks[feature.spec.name], head)
                parts.append(sp.csr_matrix((np.ones(n), (every, rank)), shape=(n, head + 1)))
        if model.pair is not None and model.spec.interaction is not None:
            a, b, _ = model.spec.interaction
            rows_a, cols_b = model.pair.shape
            pair = (np.minimum(planted.ranks[a], rows_a - 1) * cols_b
                    + np.minimum(planted.ranks[b], cols_b - 1))
            parts.append(sp.csr_matrix((np.ones(n), (every, pair)), shape=(n, model.pair.size)))
        blocks.append(sp.hstack(parts).tocsr())
        labels.append(planted.label)
    return sp.vstack(blocks).tocsr(), np.concatenate(labels)


def oracle_auc(rows: int, seed: int) -> dict[str, Any]:
    """Test AUC of the planted structure fitted on the training rows, its L2 weight walked
    by factors of 3 from C = 1 while the validation logloss falls."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss, roc_auc_score

    design, labels = planted_design(rows, seed)
    counts = split_rows(rows, DEFAULT_SPLITS)
    bounds = np.cumsum([0, *counts.values()])
    part = {name: slice(int(bounds[i]), int(bounds[i + 1])) for i, name in enumerate(counts)}

    def fit(c: float) -> tuple[float, float]:
        lr = LogisticRegression(C=c, max_iter=2000).fit(design[part["train"]],
                                                        labels[part["train"]])
        val = log_loss(labels[part["val"]], lr.predict_proba(design[part["val"]])[:, 1])
        test = roc_auc_score(labels[part["test"]], lr.predict_proba(design[part["test"]])[:, 1])
        return float(val), float(test)

    tried = {1.0: fit(1.0)}
    for factor in (1 / 3, 3.0):
        c = 1.0
        while (c * factor) not in tried:
            tried[c * factor] = fit(c * factor)
            if tried[c * factor][0] >= tried[c][0]:
                break
            c *= factor
    best = min(tried, key=lambda k: tried[k][0])
    return {"oracle_auc": tried[best][1], "oracle_c": best, "oracle_weights": design.shape[1],
            "oracle_tried": {str(k): v for k, v in sorted(tried.items())}}


def _step(args: list[str]) -> float:
    start = time.perf_counter()
    code = ctrctl([*args, "--no-track"])
    if code != 0:
        raise SystemExit(f"ctrctl {args[0]} failed with exit code {code}")
    return time.perf_counter() - start


def case(rows: int, seed: int, work: Path, oracle: bool) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    schema = "criteo_vocab.yaml" if rows <= VOCAB_UP_TO else "criteo.yaml"
    seconds = {"synth": _step(["synth", "--rows", str(rows), "--seed", str(seed),
                               "--out", str(work / "logs")])}
    synth = json.loads((work / "logs" / "synth.json").read_text())
    seconds["preprocess"] = _step(
        ["preprocess", "--schema", str(ROOT / "schemas" / schema), "--out", str(work / "ds"),
         *[a for s in ("train", "val", "test")
           for a in ("--input", f"{s}={work / 'logs' / f'{s}.tsv'}")]])
    seconds["train"] = _step(["train", "--dataset", str(work / "ds"), "--out", str(work / "run")])
    seconds["eval"] = _step(["eval", "--checkpoint", str(work / "run"), "--dataset",
                             str(work / "ds"), "--split", "test", "--out", str(work / "eval"),
                             "--no-baselines"])
    run = json.loads((work / "run" / "metrics.json").read_text())
    evaluated = json.loads((work / "eval" / "metrics.json").read_text())
    best = synth["best_auc"]["test"]
    result = {
        "rows": rows, "schema": schema, "test_auc": evaluated["auc"], "best_auc": best,
        "gap": best - evaluated["auc"], "test_logloss": evaluated["logloss"],
        "sizes": run["sizes"], "stop_reason": run["stop_reason"], "step": run["step"],
        "best_step": run["best_step"], "samples_per_s": run["samples_per_s"],
        "seconds": seconds,
    }
    if oracle:
        start = time.perf_counter()
        result.update(oracle_auc(rows, seed))
        result["seconds"]["oracle"] = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    for rows in [int(r) for r in args.rows.split(",") if r]:
        load_before = os.getloadavg()[0]
        result = case(rows, args.seed, args.work / f"rows-{rows}", rows <= args.oracle_up_to)
        result["loadavg"] = [load_before, os.getloadavg()[0]]
        results.append(result)
        print(f"{rows:>11,} rows ({result['schema']}): test AUC {result['test_auc']:.4f}, best "
              f"{result['best_auc']:.4f}, gap {result['gap']:+.4f}; batch "
              f"{result['sizes']['batch_size']}, {result['step']} steps "
              f"({result['stop_reason']}, best {result['best_step']}), "
              f"{result['samples_per_s']:,.0f} samples/s, train {result['seconds']['train']:.0f} s,"
              f" load {load_before:.2f} -> {result['loadavg'][1]:.2f}", flush=True)
        if "oracle_auc" in result:
            print(f"{'':>11}  the planted structure fitted on the same rows: test AUC "
                  f"{result['oracle_auc']:.4f} (L2 C={result['oracle_c']:g}), best - oracle "
                  f"{result['best_auc'] - result['oracle_auc']:+.4f}, oracle - defaults "
                  f"{result['oracle_auc'] - result['test_auc']:+.4f}", flush=True)
        shutil.rmtree(args.work / f"rows-{rows}", ignore_errors=True)
    write_json_atomic(args.out, {"benchmark": "defaults_synth", "results": results})
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
