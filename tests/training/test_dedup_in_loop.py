"""``training.dedup``: the config key and the CLI flag, and the train loop on 2 ranks with
deduplicated lookups through each exact pipeline (resumes bitwise, matches ``off``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ctrctl.cli.app import app
from ctrctl.config import load_config
from ctrctl.distributed.processes import run_multiprocess
from ctrctl.errors import ConfigError
from ctrctl.testing.datasets import SyntheticDataset, make_dataset
from ctrctl.testing.training_ranks import pipeline_resume_body

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=64", "training.epochs=2", "training.val_every=5",
    "training.checkpoint_every=4", "training.log_every=3", "training.num_workers=1",
    "training.shuffle_buffer=300", "training.device=cpu",
    "training.early_stopping.enabled=false",
]


def test_the_config_key_and_the_flag() -> None:
    assert load_config(None, []).training.dedup == "off"
    assert load_config(None, ["training.dedup=auto"]).training.dedup == "auto"
    # YAML reads a bare on/off as a boolean
    assert load_config(None, ["training.dedup=on"]).training.dedup == "on"
    assert load_config(None, ["training.dedup=off"]).training.dedup == "off"
    with pytest.raises(ConfigError, match="dedup"):
        load_config(None, ["training.dedup=sometimes"])
    result = CliRunner().invoke(app, ["train", "--help"], terminal_width=200)
    assert "--dedup" in result.output


@pytest.mark.slow
@pytest.mark.distributed
def test_dedup_trains_through_the_loop_on_two_ranks(tmp_path: Path) -> None:
    from ctrctl.distributed.default_plan import forced_plan
    from ctrctl.models import build as model_io

    ds: SyntheticDataset = make_dataset(
        tmp_path / "ds", {"train": 640, "val": 200, "test": 100}, num_dense=3, num_sparse=4,
        num_embeddings=[40, 50, 60, 30], row_group_size=128, seed=5)
    model = model_io.build_model(load_config(None, OVERRIDES), ds.manifest, torch.device("cpu"))
    plan = forced_plan(model.sparse_arch.embedding_bag_configs(), 2,  # type: ignore[operator]
                       {"C1": "row_wise", "C2": "table_wise", "C3": "column_wise",
                        "C4": "data_parallel"})
    runs = {}
    for mode in ("off", "on"):
        ranks = run_multiprocess(pipeline_resume_body, 2, args=(
            str(ds.path), str(tmp_path / mode), [*OVERRIDES, f"training.dedup={mode}"],
            plan.to_dict(), ["base", "sparse-dist"], 7), timeout_s=300)
        runs[mode] = ranks[0]
    for name, r in runs["on"].items():
        assert r["steps"][0] == r["steps"][1], name
        assert r["history"][0] == r["history"][1], name      # resumed exactly
        for key, value in r["whole"].items():
            assert torch.equal(r["resumed"][key], value), (name, key)
            torch.testing.assert_close(value, runs["off"][name]["whole"][key])


@pytest.mark.slow
@pytest.mark.distributed
def test_dedup_with_a_cached_table_through_prefetch(tmp_path: Path) -> None:
    from ctrctl.distributed.default_plan import forced_plan
    from ctrctl.models import build as model_io

    ds: SyntheticDataset = make_dataset(
        tmp_path / "ds", {"train": 640, "val": 200, "test": 100}, num_dense=3, num_sparse=4,
        num_embeddings=[40, 50, 60, 30], row_group_size=128, seed=5)
    overrides = [*OVERRIDES, "model.cached_tables={C1: 0.25}", "training.dedup=on"]
    model = model_io.build_model(load_config(None, overrides), ds.manifest, torch.device("cpu"))
    plan = forced_plan(model.sparse_arch.embedding_bag_configs(), 2,  # type: ignore[operator]
                       {"C1": "row_wise", "C2": "table_wise", "C3": "table_wise",
                        "C4": "row_wise"})
    ranks = run_multiprocess(pipeline_resume_body, 2, args=(
        str(ds.path), str(tmp_path / "run"), overrides, plan.to_dict(), ["base", "prefetch"],
        7), timeout_s=300)
    base = ranks[0]["base"]["whole"]
    for name, r in ranks[0].items():
        assert r["history"][0] == r["history"][1], name           # resumed exactly
        for key, value in base.items():                           # prefetch = base, bitwise
            assert torch.equal(r["whole"][key], value), (name, key)
