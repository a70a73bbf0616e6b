"""Default training on synthetic logs of several sizes against the best AUC synth reports.

For each size: ``ctrctl synth --rows N`` (Criteo format, train/val/test = 0.8/0.1/0.1) ->
``ctrctl preprocess`` with the schema the README says to pick for that size (a vocabulary
schema, ``schemas/criteo_vocab.yaml``, up to a few million rows; ``schemas/criteo.yaml``'s
fixed hash sizes above) -> ``ctrctl train`` with no config and no overrides -> ``ctrctl eval
--split test``, all through the real CLI. Reported per size: test AUC, the best achievable
test AUC (the true click probabilities' AUC, from synth.json), the gap (target: under 0.01),
the sizes the defaults chose, why and when training stopped, and training samples/s (the
large case should keep the large-batch rate of scripts/bench_train.py).

Usage:
    python scripts/check_defaults_synth.py [--rows 10000,1000000,10000000] [--work DIR]
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

from ctrctl.cli.app import main as ctrctl
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
    parser.add_argument("--out", type=Path, default=Path("bench-out/defaults_synth.json"))
    return parser.parse_args(argv)


def _step(args: list[str]) -> float:
    start = time.perf_counter()
    code = ctrctl([*args, "--no-track"])
    if code != 0:
        raise SystemExit(f"ctrctl {args[0]} failed with exit code {code}")
    return time.perf_counter() - start


def case(rows: int, seed: int, work: Path) -> dict[str, Any]:
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
    return {
        "rows": rows, "schema": schema, "test_auc": evaluated["auc"], "best_auc": best,
        "gap": best - evaluated["auc"], "test_logloss": evaluated["logloss"],
        "sizes": run["sizes"], "stop_reason": run["stop_reason"], "step": run["step"],
        "best_step": run["best_step"], "samples_per_s": run["samples_per_s"],
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    for rows in [int(r) for r in args.rows.split(",") if r]:
        load_before = os.getloadavg()[0]
        result = case(rows, args.seed, args.work / f"rows-{rows}")
        result["loadavg"] = [load_before, os.getloadavg()[0]]
        results.append(result)
        print(f"{rows:>11,} rows ({result['schema']}): test AUC {result['test_auc']:.4f}, best "
              f"{result['best_auc']:.4f}, gap {result['gap']:+.4f}; batch "
              f"{result['sizes']['batch_size']}, {result['step']} steps "
              f"({result['stop_reason']}, best {result['best_step']}), "
              f"{result['samples_per_s']:,.0f} samples/s, train {result['seconds']['train']:.0f} s,"
              f" load {load_before:.2f} -> {result['loadavg'][1]:.2f}", flush=True)
        shutil.rmtree(args.work / f"rows-{rows}", ignore_errors=True)
    write_json_atomic(args.out, {"benchmark": "defaults_synth", "results": results})
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
