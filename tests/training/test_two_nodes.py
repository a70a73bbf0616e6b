"""Two "nodes" on one machine: two torchrun launchers (``--nnodes 2``), two processes each,
meeting at 127.0.0.1, every table sharded table-row-wise; training matches one process.

How the runs see the same data: the train split holds exactly one global batch (B rows).
Over W ranks the loader gives rank r the rows ``[r*B/W, (r+1)*B/W)``, i.e. its slice of
that global batch, so every step of the 4-rank run and of the 1-process run computes the
gradient of the same rows (each shuffles its rows within the step, which only changes the
order of a sum). Several epochs = several optimizer steps over the same global batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.distributed.processes import free_port
from ctrctl.models import build as model_io
from ctrctl.testing.datasets import make_dataset

BATCH = 256
SETTINGS = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    f"training.batch_size={BATCH}", "training.epochs=5", "training.val_every=100",
    "training.checkpoint_every=100", "training.log_every=1", "training.num_workers=1",
    "training.device=cpu", "eval.batch_size=64",
]


def _ctrctl(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", CTRCTL_DIST_TIMEOUT_S="120")
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen([sys.executable, "-m", "ctrctl", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str], what: str, timeout: float = 500) -> None:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == 0, f"{what} failed:\n{err[-4000:]}"


def _named(name: str) -> Callable[[str], str]:
    return lambda message: f"{name}: {message}"


def _tables(out: Path) -> dict[str, torch.Tensor]:
    meta = ckpt.read_metadata(out)
    wanted = [(t, 0, 0, *meta.table_shape(t)) for t in sorted(meta.tables)]
    return {s.table: s.weight for s in ckpt.load_table_shards(meta.path, wanted,
                                                              with_optimizer=False)}


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_of_two_processes_match_one_process(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", {"train": BATCH, "val": 300}, num_dense=3,
                      num_sparse=4, num_embeddings=[40, 50, 60, 30], row_group_size=128,
                      seed=11)
    config = load_config(None, SETTINGS)
    model = model_io.build_model(config, ds.manifest, torch.device("cpu"))
    ebc: Any = model.sparse_arch
    plan = forced_plan(ebc.embedding_bag_configs(), 4, "table_row_wise",
                       local_world_size=2)
    plan.save(tmp_path / "plan.json")

    common = ["train", "--dataset", str(ds.path), *SETTINGS, "--no-track"]
    endpoint = f"127.0.0.1:{free_port()}"
    # One output folder for both nodes: on real nodes it is shared storage (rank 0 names
    # each checkpoint folder, every rank writes its pieces into it).
    nodes = [_ctrctl([*common, "--out", str(tmp_path / "nodes"), "--plan",
                      str(tmp_path / "plan.json"), "--nproc-per-node", "2", "--nnodes", "2",
                      "--node-rank", str(r), "--rdzv-endpoint", endpoint], tmp_path)
             for r in (0, 1)]
    for r, proc in enumerate(nodes):
        _finish(proc, f"node {r}")
    _finish(_ctrctl([*common, "--out", str(tmp_path / "one")], tmp_path), "one process")

    sharded, single = ckpt.read_metadata(tmp_path / "nodes"), ckpt.read_metadata(tmp_path / "one")
    assert (sharded.world_size, single.world_size) == (4, 1)
    assert sharded.step == single.step == 5
    assert {p.rank for t in sharded.tables for p in sharded.pieces(t)} == {0, 1, 2, 3}
    assert sharded.plan is not None and {
        s["sharding_type"] for s in sharded.plan["tables"].values()} == {"table_row_wise"}

    # Same weights after 5 steps, default tolerances (the sums run in another order).
    four, one = _tables(tmp_path / "nodes"), _tables(tmp_path / "one")
    assert sorted(four) == sorted(one) == ["C1", "C2", "C3", "C4"]
    initial = ebc.embedding_bag_weights()
    assert all(not torch.equal(one[t], initial[t]) for t in one), "every table trained"
    for table in one:
        torch.testing.assert_close(four[table], one[table], msg=_named(table))
    dense_four, _ = ckpt.load_dense(sharded.path)
    dense_one, _ = ckpt.load_dense(single.path)
    assert sorted(dense_four) == sorted(dense_one)
    for key in dense_one:
        torch.testing.assert_close(dense_four[key], dense_one[key],
                                   msg=_named(key))
    # and the same validation metrics (val rows scored across the 4 ranks, gathered)
    m4 = json.loads((tmp_path / "nodes" / "metrics.json").read_text())["metrics"]
    m1 = json.loads((tmp_path / "one" / "metrics.json").read_text())["metrics"]
    assert m4["val.rows"] == m1["val.rows"] == 300
    for key in ("val.auc", "val.logloss"):
        torch.testing.assert_close(torch.tensor(m4[key]), torch.tensor(m1[key]),
                                   msg=_named(key))
