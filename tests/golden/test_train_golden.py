"""Golden end-to-end run: ``ctrctl synth`` -> ``ctrctl preprocess`` -> ``ctrctl train``.

The real CLI (in subprocesses) on small seeded synthetic logs; the per-step training loss and
the validation metrics in the run's ``metrics.json`` are compared with the numbers recorded in
``train_golden.json``, at a tight tolerance, so that a refactor that changes the numerics of
preprocessing, the model, the kernels, the optimizers or validation fails here.

Every setting that shapes the numbers is pinned in ``config.yaml`` and ``schema.yaml`` beside
this file, so a change of the built-in defaults does not move the curve. A deliberate change of
numerics re-records the numbers (and says why in its commit)::

    .venv/bin/python -m tests.golden.test_train_golden      # rewrites train_golden.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GOLDEN = HERE / "train_golden.json"
ROWS = 4000
SEED = 1
#: float32 losses summed in a fixed order on one thread: reruns agree bitwise; 1e-5 leaves
#: room for another BLAS build only.
RTOL = 1e-5


def _ctrctl(args: list[str], cwd: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "ctrctl", *args, "--no-track"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"ctrctl {args[0]} failed:\n{proc.stdout[-2000:]}\n" \
                                 f"{proc.stderr[-3000:]}"


def run_pipeline(work: Path) -> dict[str, Any]:
    """Synthesize, preprocess and train in ``work``; the curve and metrics the run logged."""
    _ctrctl(["synth", "--format", "criteo", "--rows", str(ROWS), "--seed", str(SEED),
             "--out", "logs"], work)
    _ctrctl(["preprocess", "--schema", str(HERE / "schema.yaml"),
             "--input", "train=logs/train.tsv", "--input", "val=logs/val.tsv",
             "--out", "dataset"], work)
    _ctrctl(["train", "--dataset", "dataset", "--out", "run",
             "--config", str(HERE / "config.yaml")], work)
    history = json.loads((work / "run" / "metrics.json").read_text())["history"]
    loss = [(h["step"], h["train.loss"]) for h in history if "train.loss" in h]
    val = [{k: h[k] for k in ("step", "val.auc", "val.logloss")}
           for h in history if "val.auc" in h]
    return {"train.loss": {"steps": [s for s, _ in loss], "values": [v for _, v in loss]},
            "val": val}


@pytest.fixture(scope="module")
def curve(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_pipeline(tmp_path_factory.mktemp("golden"))


def test_train_loss_curve_matches_golden(curve: dict[str, Any]) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert curve["train.loss"]["steps"] == golden["train.loss"]["steps"]
    torch.testing.assert_close(
        torch.tensor(curve["train.loss"]["values"], dtype=torch.float64),
        torch.tensor(golden["train.loss"]["values"], dtype=torch.float64),
        rtol=RTOL, atol=0.0)


def test_validation_metrics_match_golden(curve: dict[str, Any]) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert [v["step"] for v in curve["val"]] == [v["step"] for v in golden["val"]]
    for key in ("val.auc", "val.logloss"):
        torch.testing.assert_close(
            torch.tensor([v[key] for v in curve["val"]], dtype=torch.float64),
            torch.tensor([v[key] for v in golden["val"]], dtype=torch.float64),
            rtol=RTOL, atol=0.0)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        recorded = run_pipeline(Path(tmp))
    GOLDEN.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"recorded {len(recorded['train.loss']['values'])} steps to {GOLDEN}")
