"""A model with a data-parallel table trained on 2 ranks: the checkpoint holds each table
block once (replicas from rank 0 only) and loads on 1 process with the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.distributed.processes import run_multiprocess
from ctrctl.models import build as model_io
from ctrctl.models.scoring import load_model
from ctrctl.testing.datasets import make_dataset
from ctrctl.testing.training_ranks import train_body

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=64", "training.max_steps=6", "training.val_every=6",
    "training.checkpoint_every=6", "training.log_every=2", "training.num_workers=1",
    "training.device=cpu",
]
TYPES = {"C1": "data_parallel", "C2": "row_wise", "C3": "table_wise", "C4": "column_wise"}


@pytest.mark.slow
@pytest.mark.distributed
def test_data_parallel_table_is_saved_once_and_loads_on_one_process(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", {"train": 800, "val": 128}, num_dense=3, num_sparse=4,
                      num_embeddings=[40, 50, 60, 30], row_group_size=256, seed=7)
    config = load_config(None, OVERRIDES)
    model = model_io.build_model(config, ds.manifest, torch.device("cpu"))
    ebc: Any = model.sparse_arch
    plan = forced_plan(ebc.embedding_bag_configs(), 2, TYPES)
    out = tmp_path / "run"
    ranks = run_multiprocess(train_body, 2, args=(str(ds.path), str(out), OVERRIDES,
                                                  plan.to_dict()), timeout_s=120)

    meta = ckpt.read_metadata(out)
    assert meta.world_size == 2 and meta.step == 6
    [replica] = meta.pieces("C1")
    assert (replica.rank, replica.row_offset, replica.col_offset, replica.rows,
            replica.cols) == (0, 0, 0, 40, 8), "the data-parallel table is saved by rank 0 only"
    for table, (rows, dim) in zip(TYPES, [(40, 8), (50, 8), (60, 8), (30, 8)], strict=True):
        assert sum(p.rows * p.cols for p in meta.pieces(table)) == rows * dim, table

    single, _, _ = load_model(out)
    loaded: Any = single.sparse_arch
    weights = loaded.embedding_bag_weights()
    for table in TYPES:
        # the same bytes on every path: no arithmetic between save and load
        torch.testing.assert_close(weights[table], ranks[0]["tables"][table], rtol=0, atol=0)
        torch.testing.assert_close(ranks[1]["tables"][table], ranks[0]["tables"][table],
                                   rtol=0, atol=0)
    assert not torch.equal(weights["C1"], ebc.embedding_bag_weights()["C1"]), \
        "the data-parallel table trained"
