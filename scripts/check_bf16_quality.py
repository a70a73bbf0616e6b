"""Validation AUC with and without bf16 autocast (training.bf16), against seed-to-seed noise.

Trains the same pipeline fp32 and bf16 for several seeds through ``ctrctl.train`` and reports
each run's validation AUC, the mean bf16 - fp32 difference per seed, and the spread of the
fp32 AUCs over seeds (the noise the difference is to be read against). Datasets:

* ``synthetic``: ``ctrctl synth`` Criteo-format logs (``--rows``), schemas/criteo.yaml,
  pipelines/default.yaml;
* ``criteo-8k``: the Criteo Kaggle sample in ../shared/data (train/dev), every feature a
  vocabulary (min_count 10), pipelines/criteo-sample.yaml; skipped where it is absent.

On a CPU without AMX-BF16/AVX512-BF16 the bf16 runs train in fp32 (with a warning), so the
difference is zero there by construction.

Usage:
    python scripts/check_bf16_quality.py [--rows 200000] [--seeds 0,1,2] [--out FILE]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ctrctl.compat import bf16_autocast_supported
from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.data.synthetic import synthesize
from ctrctl.io import write_json_atomic
from ctrctl.training.loop import train

ROOT = Path(__file__).resolve().parents[1]
CRITEO_8K = ROOT.parent / "shared" / "data" / "criteo-kaggle-8k"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="synthetic rows")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--datasets", default="criteo-8k,synthetic")
    parser.add_argument("--out", type=Path, default=Path("bench-out/bf16_quality.json"))
    return parser.parse_args(argv)


def _vocab_schema(folder: Path) -> Path:
    schema = yaml.safe_load((ROOT / "schemas" / "criteo.yaml").read_text())
    for column in schema["columns"]:
        if column.get("role") == "sparse":
            column.pop("hash_size", None)
            column["min_count"] = 10
    path = folder / "criteo-vocab.yaml"
    path.write_text(yaml.safe_dump(schema))
    return path


def _dataset(name: str, folder: Path, rows: int) -> tuple[Path, Path] | None:
    """(dataset folder, pipeline YAML), or None where the data is absent."""
    out = folder / name
    folder.mkdir(parents=True, exist_ok=True)
    if name == "synthetic":
        logs = synthesize(folder / "logs", rows=rows, format="criteo", seed=0)
        del logs
        preprocess(ROOT / "schemas" / "criteo.yaml",
                   [f"{s}={folder / 'logs' / f'{s}.tsv'}" for s in ("train", "val")], out)
        return out, ROOT / "pipelines" / "default.yaml"
    if not CRITEO_8K.exists():
        return None
    preprocess(_vocab_schema(folder), [f"train={CRITEO_8K / 'train.csv'}",
                                       f"val={CRITEO_8K / 'dev.csv'}"], out)
    return out, ROOT / "pipelines" / "criteo-sample.yaml"


def run(args: argparse.Namespace) -> dict[str, Any]:
    seeds = [int(s) for s in args.seeds.split(",") if s]
    report: dict[str, Any] = {"bf16_supported": bf16_autocast_supported("cpu"), "datasets": {}}
    with tempfile.TemporaryDirectory(prefix="bf16-quality-") as tmp:
        root = Path(tmp)
        for name in [d for d in args.datasets.split(",") if d]:
            made = _dataset(name, root / name, args.rows)
            if made is None:
                report["datasets"][name] = {"skipped": f"{CRITEO_8K} is absent"}
                continue
            dataset, pipeline = made
            aucs: dict[str, list[float]] = {"fp32": [], "bf16": []}
            for seed in seeds:
                for mode in ("fp32", "bf16"):
                    cfg = load_config(pipeline, [f"training.seed={seed}",
                                                 f"training.bf16={mode == 'bf16'}"])
                    result = train(dataset, root / f"run-{name}-{mode}-{seed}", cfg)
                    aucs[mode].append(float(result.metrics["val.auc"]))
            diffs = [b - a for a, b in zip(aucs["fp32"], aucs["bf16"], strict=True)]
            report["datasets"][name] = {
                "val_auc": aucs,
                "bf16_minus_fp32_per_seed": diffs,
                "mean_difference": statistics.mean(diffs),
                "fp32_seed_spread": max(aucs["fp32"]) - min(aucs["fp32"]),
            }
    return report


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(argv)
    report = run(args)
    print(f"bf16 units on this CPU: {report['bf16_supported']}")
    for name, entry in report["datasets"].items():
        if "skipped" in entry:
            print(f"{name}: skipped ({entry['skipped']})")
            continue
        print(f"{name}: val AUC fp32 {entry['val_auc']['fp32']}, bf16 {entry['val_auc']['bf16']}")
        print(f"  bf16 - fp32 per seed {[f'{d:+.4f}' for d in entry['bf16_minus_fp32_per_seed']]}"
              f", mean {entry['mean_difference']:+.4f}; fp32 spread over seeds "
              f"{entry['fp32_seed_spread']:.4f}")
    write_json_atomic(args.out, report)
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
