"""The whole pipeline on built-in synthetic data: what `make demo` runs.

synth -> preprocess -> plan -> train -> eval, each step through the real CLI and tracked in
MLflow (sqlite ``mlflow.db`` in the working folder unless MLFLOW_TRACKING_URI says otherwise).
Everything lands in ``--out`` (default ``demo/``), which the demo replaces on each run: it is
the demo's own scratch folder.

Usage:
    python scripts/demo.py [--out demo] [--rows 200000] [--nproc-per-node 1]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo"))
    parser.add_argument("--rows", type=int, default=200_000, help="synthetic rows in all")
    parser.add_argument("--nproc-per-node", type=int, default=1,
                        help="training processes (gloo on CPU)")
    parser.add_argument("--config", type=Path, default=ROOT / "pipelines" / "demo.yaml")
    return parser.parse_args(argv)


def ctrctl(*args: str) -> None:
    cmd = [sys.executable, "-m", "ctrctl", *args]
    print(f"\n$ ctrctl {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out: Path = args.out
    if out.exists():
        print(f"replacing the demo's previous output in {out}/")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    raw, dataset, plan = out / "raw", out / "dataset", out / "plan.json"
    train_out, eval_out = out / "train", out / "eval"
    try:
        ctrctl("synth", "--format", "criteo", "--rows", str(args.rows), "--seed", "0",
               "--out", str(raw))
        ctrctl("preprocess", "--schema", str(ROOT / "schemas" / "criteo_vocab.yaml"),
               "--input", f"train={raw / 'train.tsv'}", "--input", f"val={raw / 'val.tsv'}",
               "--input", f"test={raw / 'test.tsv'}", "--out", str(dataset))
        ctrctl("plan", "--dataset", str(dataset), "--config", str(args.config),
               "--world-size", str(args.nproc_per_node), "--device", "cpu", "--out", str(plan))
        ctrctl("train", "--dataset", str(dataset), "--config", str(args.config),
               "--plan", str(plan), "--nproc-per-node", str(args.nproc_per_node),
               "--out", str(train_out))
        ctrctl("eval", "--checkpoint", str(train_out), "--dataset", str(dataset),
               "--split", "test", "--out", str(eval_out), "--gate", "auc>=0.70")
    except subprocess.CalledProcessError as exc:
        print(f"demo failed at: {' '.join(map(str, exc.cmd[2:]))}", file=sys.stderr)
        return exc.returncode or 1
    metrics = json.loads((eval_out / "metrics.json").read_text())
    best = json.loads((raw / "synth.json").read_text()).get("best_auc", {}).get("test")
    print(f"\ntest AUC {metrics['auc']:.4f} (best achievable {best:.4f}), "
          f"logloss {metrics['logloss']:.4f}, calibration {metrics['calibration']:.3f}")
    print(f"artifacts in {out}/; runs in MLflow (`mlflow ui` to browse)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
