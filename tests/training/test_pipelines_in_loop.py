"""The train loop through each pipeline: the exact ones give base's model, resume exactly at
world size 1 and 2 (mixed plan), validate through the pipeline, and write a trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ctrctl.config import load_config
from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.datasets import SyntheticDataset, make_dataset
from ctrctl.testing.training_ranks import pipeline_resume_body
from ctrctl.training.loop import train

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=64", "training.epochs=2", "training.val_every=5",
    "training.checkpoint_every=4", "training.log_every=3", "training.num_workers=1",
    "training.shuffle_buffer=300", "training.device=cpu",
    "training.early_stopping.enabled=false",
]


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDataset:
    return make_dataset(tmp_path_factory.mktemp("ds") / "ds",
                        {"train": 640, "val": 200, "test": 100}, num_dense=3, num_sparse=4,
                        num_embeddings=[40, 50, 60, 30], row_group_size=128, seed=5)


def _check_exact(results: dict, where: str) -> None:  # type: ignore[type-arg]
    base = results["base"]["whole"]
    for name, r in results.items():
        assert r["steps"][0] == r["steps"][1], (where, name, r["steps"])
        assert r["history"][0] == r["history"][1], (where, name)   # losses and val metrics
        assert r["history"][0] == results["base"]["history"][0], (where, name)
        for key, value in base.items():
            assert torch.equal(r["whole"][key], value), (where, name, "whole", key)
            assert torch.equal(r["resumed"][key], value), (where, name, "resumed", key)


def test_exact_pipelines_resume_bitwise_in_one_process(ds: SyntheticDataset,
                                                       tmp_path: Path) -> None:
    results = pipeline_resume_body(0, 1, str(ds.path), str(tmp_path), OVERRIDES, None,
                                   ["base", "sparse-dist", "prefetch"], 7)
    _check_exact(results, "world 1")


def _resume_on_two_ranks(ds: SyntheticDataset, tmp_path: Path, overrides: list[str],
                         types: dict[str, str], pipelines: list[str]) -> dict:  # type: ignore[type-arg]
    """Whole and resumed runs of each pipeline on 2 ranks under a per-table plan."""
    from ctrctl.distributed.default_plan import forced_plan
    from ctrctl.models import build as model_io

    model = model_io.build_model(load_config(None, overrides), ds.manifest, torch.device("cpu"))
    tables = model.sparse_arch.embedding_bag_configs()  # type: ignore[operator]
    plan = forced_plan(tables, 2, types)
    ranks = run_multiprocess(pipeline_resume_body, 2, args=(
        str(ds.path), str(tmp_path), overrides, plan.to_dict(), pipelines, 7), timeout_s=300)
    return ranks[0]


@pytest.mark.slow
@pytest.mark.distributed
def test_exact_pipelines_resume_bitwise_on_two_ranks(ds: SyntheticDataset,
                                                     tmp_path: Path) -> None:
    results = _resume_on_two_ranks(ds, tmp_path, OVERRIDES, {
        "C1": "row_wise", "C2": "table_wise", "C3": "column_wise", "C4": "data_parallel"},
        ["base", "sparse-dist"])
    _check_exact(results, "world 2")


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_cached_table_trains_and_resumes_through_the_loop(
        ds: SyntheticDataset, tmp_path: Path) -> None:
    results = _resume_on_two_ranks(ds, tmp_path, [*OVERRIDES, "model.cached_tables={C1: 0.25}"],
                                   {"C1": "row_wise", "C2": "table_wise", "C3": "table_wise",
                                    "C4": "row_wise"}, ["base", "prefetch"])
    _check_exact(results, "world 2, C1 cached")


def test_semi_sync_trains_and_the_trace_shows_its_worker(ds: SyntheticDataset,
                                                         tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    cfg = load_config(None, [*OVERRIDES, "training.pipeline=semi-sync",
                             "training.semi_sync_start_step=3", f"training.trace={trace}"])
    result = train(ds.path, tmp_path / "run", cfg)
    base = train(ds.path, tmp_path / "base", load_config(None, [
        *OVERRIDES, "training.pipeline=base"]))
    assert result.step == base.step == 20
    # one step older embeddings from step 3 on: close to base, not equal
    assert result.metrics["train.loss"] != base.metrics["train.loss"]
    assert abs(result.metrics["val.auc"] - base.metrics["val.auc"]) < 0.05
    events = json.loads(trace.read_text())["traceEvents"]
    ahead = [e for e in events if e["name"] == "embedding_ahead"]
    assert sorted(e["args"]["step"] for e in ahead) == list(range(3, 20))
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert any(t.startswith("ctrctl-semi-sync") for t in threads)
    assert [e for e in events if e["name"] == "score"]  # validation went through it too
