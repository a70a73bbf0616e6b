"""The recheck: finalists retrained on fresh val samples drawn from train; a trial that won
on the search's val split alone does not win when it trains worse on the fresh samples."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pyarrow.parquet as pq
import pytest
from optuna.distributions import FloatDistribution

from ctrctl.config import load_config
from ctrctl.testing.datasets import make_dataset
from ctrctl.tuning.recheck import RECORD, Candidate, holdout_views, recheck
from ctrctl.tuning.trial import training_view, write_trial_config

BASE = ["training.epochs=1", "training.num_workers=0", "training.batch_size=64"]


def _ids(path: Path) -> set[tuple[object, ...]]:
    """Rows as tuples of every column (the synthetic rows are distinct)."""
    table = pq.read_table(path)
    return set(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def test_holdouts_draw_fresh_val_rows_from_train_and_keep_its_size(tmp_path: Path) -> None:
    dataset = tmp_path / "data"
    make_dataset(dataset, rows={"train": 900, "val": 100, "test": 100}, num_dense=2,
                 num_sparse=2, num_embeddings=50, seed=0)
    view = training_view(dataset, tmp_path / "view", "val")
    views = holdout_views(view, tmp_path / "holdouts", "val", 2, seed=0)
    train = set().union(*(_ids(p) for p in (dataset / "train").glob("*.parquet")))
    val = set().union(*(_ids(p) for p in (dataset / "val").glob("*.parquet")))
    drawn = []
    for folder in views:
        manifest = json.loads((folder / "manifest.json").read_text())
        assert sorted(manifest["splits"]) == ["train", "val"]  # no test split to reach
        fresh = _ids(folder / "val" / "part-00000.parquet")
        rest = _ids(folder / "train" / "part-00000.parquet")
        assert len(fresh) == manifest["splits"]["val"]["rows"] == 100
        assert len(rest) == manifest["splits"]["train"]["rows"] == 900
        assert fresh <= train and not fresh & rest and val <= rest
        drawn.append(fresh)
    assert not drawn[0] & drawn[1]
    assert holdout_views(view, tmp_path / "holdouts", "val", 2, seed=0) == views  # reused


def test_a_val_fluke_loses_the_recheck_to_the_base(tmp_path: Path) -> None:
    """Trial 1 is recorded with a val logloss better than the base's, but its learning rate
    (1e-5) barely trains: on the fresh val samples the base wins the mean."""
    from ctrctl.testing.threads import torch_threads

    dataset = tmp_path / "data"
    make_dataset(dataset, rows=2000, num_dense=4, num_sparse=4, num_embeddings=100, seed=0)
    view = training_view(dataset, tmp_path / "tune" / ".view", "val")
    out = tmp_path / "tune"
    study = optuna.create_study(direction="minimize")
    lr = FloatDistribution(1e-6, 1.0, log=True)
    for number, (value, rate, base) in enumerate([(0.60, 0.1, True), (0.58, 1e-5, False)]):
        config = load_config(None, [*BASE, f"embedding_optimizer.lr={rate}",
                                    f"dense_optimizer.lr={rate}"])
        path = write_trial_config(out, number, config)
        study.add_trial(optuna.trial.create_trial(
            params={"embedding_optimizer.lr": rate}, distributions={"embedding_optimizer.lr": lr},
            value=value, user_attrs={"config": str(path.with_suffix(".json")), "base": base}))
    assert study.best_trial.number == 1
    with torch_threads(1):
        winner, candidates = recheck(study, out, view, "val.logloss", "val", finalists=3,
                                     holdouts=2)
    assert winner == 0
    assert [c.number for c in candidates] == [0, 1]
    assert all(len(c.values) == 3 for c in candidates)
    fluke = candidates[1]
    assert min(fluke.values[1:]) > max(candidates[0].values[1:])  # it trains worse
    record = json.loads((out / RECORD).read_text())
    assert sorted(record) == ["trial 0", "trial 1"]
    # a second call (a rerun) reads the record and trains nothing again
    (out / "recheck").rename(tmp_path / "moved")
    assert recheck(study, out, view, "val.logloss", "val", 3, 2)[0] == 0
    assert not (out / "recheck").exists()


@pytest.mark.parametrize("finalists, holdouts", [(0, 2), (3, 0)])
def test_no_recheck_leaves_the_val_winner(tmp_path: Path, finalists: int,
                                          holdouts: int) -> None:
    study = optuna.create_study(direction="maximize")
    for value, base in [(0.7, True), (0.8, False)]:
        study.add_trial(optuna.trial.create_trial(
            params={}, distributions={}, value=value, user_attrs={"base": base}))
    winner, candidates = recheck(study, tmp_path, tmp_path, "val.auc", "val", finalists,
                                 holdouts)
    assert winner == 1 and candidates[0].values == (0.8,)
    assert not (tmp_path / RECORD).exists()


def test_the_search_value_a_finalist_was_picked_by_does_not_count() -> None:
    assert Candidate(1, False, (0.10, 0.50, 0.70)).score == pytest.approx(0.60)
    assert Candidate(0, True, (0.40,)).score == pytest.approx(0.40)  # nothing rechecked
