"""AUC and logloss per table type against the FP32 checkpoint, on Criteo and synthetic data.

Trains an FP32 model on each dataset, quantizes it to every type and scores the same rows
with each (``ctrctl.inference.accuracy.dtype_accuracy``):

* ``criteo-kaggle-8k``: the licensed 8k-row sample (``--criteo``, default
  ../shared/data/criteo-kaggle-8k; skipped when absent), preprocessed with vocabularies
  (min_count 10) and trained with pipelines/criteo-sample.yaml; scored on dev + test;
* ``synthetic``: a planted logistic click model (``ctrctl.testing.datasets``; 26 sparse
  features x 2,000 ids, 13 dense; 40k train rows), dim 16; scored on test (10k rows).

Usage:
    python scripts/quantize_accuracy.py [--quick] [--out bench-out/quantize_accuracy.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ctrctl.io import write_json_atomic
from ctrctl.testing.accuracy import criteo_sample_accuracy, synthetic_accuracy

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--criteo", type=Path, default=ROOT.parent / "shared" / "data" /
                        "criteo-kaggle-8k")
    parser.add_argument("--quick", action="store_true", help="a smaller synthetic set")
    parser.add_argument("--out", type=Path, default=Path("bench-out/quantize_accuracy.json"))
    return parser.parse_args(argv)


def criteo_rows(folder: Path, work: Path) -> list[dict[str, Any]]:
    return criteo_sample_accuracy(folder, work, ROOT)


def synthetic_rows(work: Path, quick: bool) -> list[dict[str, Any]]:
    rows = {"train": 10_000, "test": 4_000} if quick else {"train": 40_000, "test": 10_000}
    return synthetic_accuracy(work, {**rows, "val": 1000})


def _print(name: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{name} ({rows[0]['rows']:,} rows)")
    print(f"{'dtype':10} {'AUC':>8} {'dAUC':>9} {'logloss':>8} {'dlogloss':>9} {'bytes':>6}")
    for r in rows:
        print(f"{r['dtype']:10} {r['auc']:8.4f} {-r['auc_loss']:+9.5f} {r['logloss']:8.4f} "
              f"{r['logloss_gain']:+9.5f} {r['bytes_ratio']:6.3f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(2)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="quantize-accuracy-") as tmp:
        work = Path(tmp)
        if args.criteo.is_dir():
            results["criteo-kaggle-8k"] = criteo_rows(args.criteo, work)
        else:
            print(f"{args.criteo} is absent: Criteo skipped", file=sys.stderr)
        results["synthetic"] = synthetic_rows(work, args.quick)
    for name, rows in results.items():
        _print(name, rows)
    write_json_atomic(args.out, results)
    failed = [f"{name} {r['dtype']}" for name, rows in results.items() for r in rows
              if (r["dtype"].partition(":")[0] == "int8" and r["auc_loss"] > 0.001)
              or (r["dtype"].partition(":")[0] == "int4" and r["auc_loss"] > 0.005)]
    if failed:
        print(f"over the bound (INT8 0.001, INT4 0.005 AUC): {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
