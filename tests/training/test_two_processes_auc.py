"""``ctrctl train --nproc-per-node 2`` on the Criteo 8k sample scores like one process with
the same global batch size and seed (dev+test AUC, 800 rows).

Both runs set ``training.global_order=true``: every rank reads the split in the one-process
order and trains on its slice of each global batch, so step k of the 2-process run sees the
same rows as step k of one process. What is left between the two is the sharded step itself
(and floating-point summation order), so one seed suffices and the AUCs must agree within
0.005. That the sharded step equals the unsharded one on the same global batch is shown
exactly in tests/distributed (golden tests) and tests/training/test_two_nodes.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.metrics.functional import roc_auc
from ctrctl.models.scoring import predict_split
from ctrctl.training.loop import train

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipelines" / "criteo-sample.yaml"
SEED = 0
ORDER = "training.global_order=true"


def _auc(out: Path, dataset: Path) -> float:
    labels, scores = [], []
    for split in ("val", "test"):
        for y, p in predict_split(out, dataset, split):
            labels.append(y)
            scores.append(p)
    y_all = np.concatenate(labels)
    assert len(y_all) == 800
    return roc_auc(y_all, np.concatenate(scores))


def _two_processes(dataset: Path, out: Path, seed: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "ctrctl", "train", "--dataset", str(dataset), "--out", str(out),
         "--config", str(PIPELINE), f"training.seed={seed}", ORDER, "--nproc-per-node", "2",
         "--no-track"], cwd=out.parent, env=env, capture_output=True, text=True, timeout=300,
        check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert ckpt.read_metadata(out).world_size == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_reach_the_auc_of_one(criteo_8k: Path, tmp_path: Path) -> None:
    dataset = tmp_path / "criteo"
    preprocess(ROOT / "schemas" / "criteo_vocab.yaml", [
        f"train={criteo_8k / 'train.csv'}", f"val={criteo_8k / 'dev.csv'}",
        f"test={criteo_8k / 'test.csv'}"], dataset)
    train(dataset, tmp_path / "one", load_config(PIPELINE, [f"training.seed={SEED}", ORDER]))
    one = _auc(tmp_path / "one", dataset)
    _two_processes(dataset, tmp_path / "two", SEED)
    two = _auc(tmp_path / "two", dataset)
    report = f"seed {SEED}: 1 process {one:.4f}, 2 processes {two:.4f}"
    print(f"dev+test AUC, global order: {report}")
    assert min(one, two) >= 0.69, report
    assert abs(one - two) <= 0.005, report
