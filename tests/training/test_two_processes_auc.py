"""``ctrctl train --nproc-per-node 2`` on the Criteo 8k sample scores like one process with
the same global batch size and seed (dev+test AUC, 800 rows).

Why a mean over seeds: the two runs do not draw the same global batches. The loader gives
each rank a contiguous half of the split and shuffles it in a rank-seeded order, so step k
of the 2-process run trains on other rows than step k of one process. On 800 scored rows
that order alone moves the AUC by up to ~0.01 (one process over seeds 0-3: 0.702-0.711), so
a single pair of runs compares orders more than it compares the sharded model. That the
sharded step itself equals the unsharded one on the same global batch is shown exactly in
tests/distributed (golden tests) and tests/training/test_two_nodes.py. Here, the mean AUC
over four seeds of each setting must agree within 0.005.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.evaluation.metrics import roc_auc
from ctrctl.training import checkpoint as ckpt
from ctrctl.training.loop import train
from ctrctl.training.predict import predict_split

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipelines" / "criteo-sample.yaml"
SEEDS = (0, 1, 2, 3)


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
         "--config", str(PIPELINE), f"training.seed={seed}", "--nproc-per-node", "2",
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
    one, two = [], []
    for seed in SEEDS:
        train(dataset, tmp_path / f"one-{seed}",
              load_config(PIPELINE, [f"training.seed={seed}"]))
        one.append(_auc(tmp_path / f"one-{seed}", dataset))
        _two_processes(dataset, tmp_path / f"two-{seed}", seed)
        two.append(_auc(tmp_path / f"two-{seed}", dataset))
    report = ", ".join(f"seed {s}: {a:.4f} / {b:.4f}" for s, a, b in zip(SEEDS, one, two,
                                                                          strict=True))
    print(f"dev+test AUC, 1 process / 2 processes: {report}")
    assert min(one + two) >= 0.69, report
    assert abs(np.mean(one) - np.mean(two)) <= 0.005, \
        f"mean AUC 1 process {np.mean(one):.4f}, 2 processes {np.mean(two):.4f} ({report})"
