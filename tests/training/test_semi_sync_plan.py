"""semi-sync with data-parallel tables in the plan is refused before any worker starts (the
workers refused it, 12 s in)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from ctrctl.cli.app import main
from ctrctl.config import load_config
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.models import build as model_io
from ctrctl.testing.datasets import make_dataset

OVERRIDES = ["model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
             "training.batch_size=64", "training.max_steps=2"]


@pytest.mark.parametrize("types", [{"C1": "data_parallel", "C2": "row_wise", "C3": "table_wise"},
                                   {"C1": "data_parallel", "C2": "data_parallel",
                                    "C3": "data_parallel"}])
def test_semi_sync_with_data_parallel_tables_fails_first(types: dict[str, str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    ds = make_dataset(tmp_path / "ds", rows=256, num_sparse=3, seed=0)
    model = model_io.build_model(load_config(None, OVERRIDES), ds.manifest, torch.device("cpu"))
    ebc: Any = model.sparse_arch
    forced_plan(ebc.embedding_bag_configs(), 2, types).save(tmp_path / "plan.json")
    start = time.monotonic()
    code = main(["train", "--dataset", str(ds.path), "--out", str(tmp_path / "run"), "--plan",
                 str(tmp_path / "plan.json"), "--nproc-per-node", "2", "--pipeline",
                 "semi-sync", *OVERRIDES, "--no-track"])
    assert code == 1 and time.monotonic() - start < 10
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "semi-sync" in lines[0] and "C1" in lines[0], err
    assert "rank" not in lines[0]  # said by this process, not by a worker
    assert not (tmp_path / "run").exists()
