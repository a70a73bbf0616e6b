"""``ctrctl train --nproc-per-node 2`` with a sharded ``ttl`` zch table: the remapper's shards
live on the ranks of their rows, the step's data time is agreed over the ranks, validation
looks keys up across ranks, and the statistics and the saved remapper state equal those of
one process over the same global batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ctrctl import checkpoint as ckpt
from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema
from ctrctl.data.synthetic_days import days_schema, synthesize_days

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[8]", "model.over_arch=[8,1]",
    "training.batch_size=128", "training.epochs=1", "training.num_workers=1",
    "training.device=cpu", "training.checkpoint_every=0", "training.val_every=5",
    # one Parquet row group a day: days come in a shuffled order, each day's rows together
    "training.global_order=true", "training.shuffle_buffer=1",
]


def _train(dataset: Path, out: Path, nproc: int) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "ctrctl", "train", "--dataset", str(dataset), "--out", str(out),
         *OVERRIDES, "--nproc-per-node", str(nproc), "--no-track"], cwd=out.parent, env=env,
        capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert ckpt.read_metadata(out).world_size == nproc
    return json.loads((out / "metrics.json").read_text())["collisions"]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_keep_the_remapper_of_one(tmp_path: Path) -> None:
    logs = synthesize_days(tmp_path / "logs", days=5, rows_per_day=512, new_ids_per_day=150,
                           initial_ids=200, popularity_drift=1.0, seed=4)
    zch = {"collision": {"kind": "zch", "capacity": 40, "eviction": "ttl", "ttl_days": 0.5,
                         "shards": 4}}
    schema = Schema.from_dict(days_schema(zch, {"hash_size": 64}))
    preprocess(schema, [f"train={logs.files[d]}" for d in (1, 2, 3, 4)] + [
        f"val={logs.files[5]}", f"test={logs.files[5]}"], tmp_path / "ds")
    one = _train(tmp_path / "ds", tmp_path / "one", 1)
    two = _train(tmp_path / "ds", tmp_path / "two", 2)
    assert one == two
    # evictions: rows of an earlier day expire once a later day's batches come
    assert one["zch.user.evictions"] > 0 and one["zch.user.lookups"] == 4 * 512
    states = [ckpt.load_dense(tmp_path / run)[0]
              for run in ("one", "two")]
    remapper = sorted(k for k in states[0] if ".remappers.user.shards." in k)
    assert len({k.split(".shards.")[1].split(".")[0] for k in remapper}) == 4  # every shard saved
    for key in remapper:
        assert torch.equal(states[0][key], states[1][key]), key
