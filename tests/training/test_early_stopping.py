"""Early stopping: the run stops by itself, ends with the best step's weights (bitwise), and a
run killed and resumed keeps its early-stopping state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.datasets import SyntheticDataset, make_dataset
from ctrctl.testing.training_ranks import train_body
from ctrctl.training.early_stopping import EarlyStopping
from ctrctl.training.loop import BEST, train

# Few rows and many ids: the tables memorize the training split within a few epochs, so
# validation logloss turns up and early stopping has something to catch.
OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=32", "training.epochs=30", "training.log_every=5",
    "training.num_workers=1", "training.shuffle_buffer=300", "training.device=cpu",
    "embedding_optimizer.lr=0.2", "dense_optimizer.lr=0.05",
]


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDataset:
    return make_dataset(tmp_path_factory.mktemp("es") / "ds", {"train": 640, "val": 320},
                        num_dense=2, num_sparse=4, num_embeddings=[400, 400, 300, 20],
                        row_group_size=128, seed=11)


def _tables(path: Path) -> dict[str, torch.Tensor]:
    meta = ckpt.read_metadata(path)
    wanted = [(t, 0, 0, *meta.table_shape(t)) for t in sorted(meta.tables)]
    out = {}
    for s in ckpt.load_table_shards(meta.path, wanted):
        out[s.table] = s.weight
        out.update({f"{s.table}.{k}": v for k, v in s.optimizer_state.items()})
    dense, _ = ckpt.load_dense(meta.path)
    out.update({f"dense.{k}": v for k, v in dense.items()})
    return out


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def test_early_stopping_state_follows_the_metric() -> None:
    es = EarlyStopping("logloss", "min", patience=2, min_delta=0.01)
    assert es.update(0.50, 10) and es.update(0.45, 20)
    assert not es.update(0.445, 30)  # better, but by less than min_delta
    assert not es.should_stop and not es.update(0.6, 40) and es.should_stop
    assert (es.best, es.best_step) == (0.45, 20)
    again = EarlyStopping("logloss", "min", patience=2)
    again.load_state(es.state())
    assert (again.best, again.best_step, again.bad) == (0.45, 20, 2)
    auc = EarlyStopping("auc", "max", patience=1)
    assert auc.update(0.7, 1) and not auc.update(0.69, 2) and auc.should_stop


def test_stops_by_itself_and_ends_with_the_best_steps_weights(ds: SyntheticDataset,
                                                               tmp_path: Path) -> None:
    cfg = load_config(None, OVERRIDES)
    result = train(ds.path, tmp_path / "es", cfg)
    per_epoch = 20
    assert result.stop_reason == "early_stopping"
    assert result.best_step is not None and result.step < 30 * per_epoch
    # validated once an epoch (val_every chosen from the data: short epochs), patience 3
    vals = [h for h in result.history if "val.logloss" in h]
    assert [h["step"] for h in vals] == [per_epoch * (i + 1) for i in range(len(vals))]
    assert result.step == result.best_step + 3 * per_epoch
    best = min(vals, key=lambda h: h["val.logloss"])
    assert best["step"] == result.best_step
    assert result.metrics["val.logloss"] == best["val.logloss"]
    metrics = json.loads((tmp_path / "es" / "metrics.json").read_text())
    assert (metrics["stop_reason"], metrics["best_step"], metrics["finished"]) == (
        "early_stopping", result.best_step, True)
    assert metrics["rows_trained"] == 640 * result.step // per_epoch

    # The final model is the best step's, bitwise: the same as a run that simply stopped
    # there, and the same as the saved best checkpoint.
    final = _tables(result.checkpoint)
    _assert_bitwise(final, _tables(tmp_path / "es" / BEST))
    short = train(ds.path, tmp_path / "short", load_config(None, [
        *OVERRIDES, f"training.max_steps={result.best_step}",
        "training.early_stopping.enabled=false"]))
    assert short.step == result.best_step and short.stop_reason == "max_steps"
    _assert_bitwise(final, _tables(short.checkpoint))


def test_resume_after_a_kill_keeps_the_early_stopping_state(ds: SyntheticDataset,
                                                           tmp_path: Path) -> None:
    cfg = load_config(None, [*OVERRIDES, "training.checkpoint_every=10"])
    whole = train(ds.path, tmp_path / "whole", cfg)
    assert whole.stop_reason == "early_stopping" and whole.best_step is not None
    # Killed after the best validation and one validation without improvement.
    kill = whole.best_step + 30
    assert kill < whole.step
    first = train(ds.path, tmp_path / "split", cfg, stop_after=kill)
    assert first.stop_reason is None and first.step == kill
    state = ckpt.load_trainer_state(first.checkpoint)["early_stopping"]
    assert (state["best_step"], state["bad"]) == (whole.best_step, 1)
    resumed = train(ds.path, tmp_path / "split", cfg, resume=True)
    assert (resumed.step, resumed.best_step, resumed.stop_reason) == (
        whole.step, whole.best_step, "early_stopping")
    assert resumed.metrics == whole.metrics
    _assert_bitwise(_tables(whole.checkpoint), _tables(resumed.checkpoint))


def test_without_a_validation_split_the_cap_ends_the_run(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "ds", {"train": 300}, num_dense=2, num_sparse=2,
                        num_embeddings=20, seed=1)
    result = train(data.path, tmp_path / "run", load_config(None, [
        *OVERRIDES, "training.epochs=2"]))
    assert (result.stop_reason, result.best_step, result.step) == ("epochs", None, 20)
    assert not (tmp_path / "run" / BEST).exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_best_weights_restore_sharded_on_two_ranks(ds: SyntheticDataset, tmp_path: Path) -> None:
    from ctrctl.distributed.default_plan import forced_plan
    from ctrctl.models import build as model_io

    cfg = load_config(None, OVERRIDES)
    model = model_io.build_model(cfg, ds.manifest, torch.device("cpu"))
    plan = forced_plan(model.sparse_arch.embedding_bag_configs(), 2,  # type: ignore[operator]
                       {"C1": "row_wise", "C2": "table_wise", "C3": "column_wise",
                        "C4": "data_parallel"})
    out = tmp_path / "run"
    ranks = run_multiprocess(train_body, 2, args=(str(ds.path), str(out), OVERRIDES,
                                                  plan.to_dict()), timeout_s=240)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stop_reason"] == "early_stopping"
    assert metrics["best_step"] < metrics["step"]
    best = ckpt.read_metadata(out / BEST)
    assert best.world_size == 2 and best.step == metrics["best_step"]
    # the final sharded model holds the best step's tables, bitwise
    best_tables = _tables(out / BEST)
    for table, weight in ranks[0]["tables"].items():
        assert torch.equal(weight, best_tables[table]), table
    _assert_bitwise(_tables(out), best_tables)
