"""``ctrctl tune``: the search finds a planted better learning rate, resumes after a kill,
prunes a diverging trial, writes a best.yaml that trains to the same val metric, never opens
the test split, and tracks one MLflow child run per trial."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from ctrctl.config import load_config
from ctrctl.testing.datasets import make_dataset
from ctrctl.tracking import make_tracker
from ctrctl.tuning import TuneRequest, TuneResult, tune
from ctrctl.tuning.study import open_study
from ctrctl.tuning.trial import STUDY_NAME, storage_url
from tests.tuning.inotify import OpenWatch

#: A short base config: trials of a few hundred tiny steps (about a second each).
BASE = ("training.epochs=1", "training.num_workers=0", "training.batch_size=64",
        "embedding_optimizer.lr=0.00001", "dense_optimizer.lr=0.00001")


def _dataset(path: Path) -> Path:
    make_dataset(path, rows=2000, num_dense=4, num_sparse=4, num_embeddings=100, seed=0)
    return path


def _space(tmp: Path, text: str) -> Path:
    path = tmp / "space.yaml"
    path.write_text(text)
    return path


def _study(out: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY_NAME, storage=storage_url(out))


@dataclass
class Searched:
    dataset: Path
    out: Path
    result: TuneResult
    opened_test_files: list[Path]
    tracking_uri: str


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Searched:
    """One 4-trial search of the embedding lr from a planted bad one (1e-5), tracked, with
    the test split's folder watched for opens (the recheck of the best trial against the
    base's included)."""
    from ctrctl.testing.threads import torch_threads

    tmp = tmp_path_factory.mktemp("tune")
    dataset = _dataset(tmp / "data")
    space = _space(tmp, "embedding_optimizer.lr: {low: 0.00001, high: 0.5, log: true}\n")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    watch = OpenWatch([dataset / "test"])
    try:
        with torch_threads(1):
            result = tune(TuneRequest(dataset=dataset, out=tmp / "tune", overrides=BASE,
                                      trials=4, space=space, seed=1, pruner="none",
                                      finalists=1),
                          tracker=make_tracker(True, uri, "tune-test"))
        opened = watch.opened()
        # the watch sees an open when there is one (so an empty list above means none)
        (dataset / "test" / "part-00000.parquet").read_bytes()
        assert watch.opened(), "the inotify watch missed an open"
    finally:
        watch.close()
    return Searched(dataset, tmp / "tune", result, opened, uri)


def test_a_four_trial_search_finds_the_planted_better_learning_rate(searched: Searched) -> None:
    result = searched.result
    trials = _study(searched.out).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    base = trials[0]
    assert base.user_attrs["base"] and base.params["embedding_optimizer.lr"] == pytest.approx(1e-5)
    assert result.best_params["embedding_optimizer.lr"] > 1e-3
    assert result.best_value is not None and result.best_value < base.value - 0.01
    best = load_config(result.best_yaml)
    assert best.embedding_optimizer.lr == pytest.approx(result.best_params["embedding_optimizer.lr"])
    assert (result.out / "trials.parquet").is_file() and (result.out / "history.png").is_file()
    import polars as pl

    table = pl.read_parquet(result.out / "trials.parquet")
    assert table["number"].to_list() == [0, 1, 2, 3]
    assert table["state"].to_list() == ["COMPLETE"] * 4
    assert (table["seconds"] > 0).all()


def test_best_yaml_trains_to_the_same_val_metric(searched: Searched, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ctrctl.cli.app import app
    from ctrctl.testing.threads import torch_threads

    out = tmp_path / "again"
    with torch_threads(1):
        got = CliRunner().invoke(app, ["train", "--dataset", str(searched.dataset), "--out",
                                       str(out), "--config", str(searched.result.best_yaml),
                                       "--no-track"])
    assert got.exit_code == 0, got.output
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert metrics["val.logloss"] == pytest.approx(searched.result.best_value, rel=1e-6)
    # best/ is the best trial's training output: its final checkpoint at the best val step
    kept = json.loads((searched.result.best / "metrics.json").read_text())
    assert kept["metrics"]["val.logloss"] == pytest.approx(searched.result.best_value)
    assert kept["best_step"] is not None


def test_the_test_split_is_never_opened(searched: Searched) -> None:
    assert searched.opened_test_files == []
    assert not (searched.out / ".view" / "test").exists()
    assert [c["trial"] for c in searched.result.recheck][-1] == 0  # the recheck ran
    assert not list((searched.out / ".holdouts").glob("*/test"))


def test_mlflow_holds_one_child_run_per_trial(searched: Searched) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=searched.tracking_uri)
    parent = searched.result.parent_run_id
    assert parent is not None
    experiment = client.get_experiment_by_name("tune-test")
    children = client.search_runs([experiment.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted(r.data.tags["mlflow.runName"] for r in children) == [
        f"trial {n}" for n in range(4)]
    assert client.get_run(parent).data.metrics["best.val.logloss"] == pytest.approx(
        searched.result.best_value)


def test_a_killed_study_resumes_with_no_trial_lost_or_run_twice(tmp_path: Path) -> None:
    dataset = _dataset(tmp_path / "data")
    out = tmp_path / "tune"
    space = _space(tmp_path, "embedding_optimizer.lr: {low: 0.001, high: 0.5, log: true}\n")
    tune(TuneRequest(dataset=dataset, out=out, overrides=BASE, trials=2, space=space,
                     pruner="none"))
    first = {t.number: t.datetime_complete for t in _study(out).trials}
    # A kill mid-trial leaves it RUNNING in the storage, with its values drawn.
    study = open_study(out, "val.logloss", 0, "median", 3)
    cut = study.ask({"embedding_optimizer.lr": optuna.distributions.FloatDistribution(
        0.001, 0.5, log=True)})
    cut_lr = cut.params["embedding_optimizer.lr"]
    result = tune(TuneRequest(dataset=dataset, out=out, overrides=BASE, trials=3, space=space,
                              pruner="none"))
    trials = _study(out).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE,
                                         TrialState.FAIL, TrialState.COMPLETE]
    assert trials[3].user_attrs["requeued_from"] == cut.number
    assert trials[3].params["embedding_optimizer.lr"] == pytest.approx(cut_lr)
    assert {n: trials[n].datetime_complete for n in first} == first  # not run again
    assert result.counts == {"COMPLETE": 3, "FAIL": 1}
    # a third run finds the study complete and trains nothing
    again = tune(TuneRequest(dataset=dataset, out=out, overrides=BASE, trials=3, space=space,
                             pruner="none"))
    assert len(_study(out).trials) == 4 and again.best_number == result.best_number


def test_pruning_stops_a_diverging_trial(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from ctrctl.cli.app import main

    dataset = _dataset(tmp_path / "data")
    out = tmp_path / "tune"
    space = _space(tmp_path, "embedding_optimizer.lr: {choices: [0.05, 0.1, 0.2, 1000.0]}\n")
    study = open_study(out, "val.logloss", 0, "median", 4)
    for lr in (0.05, 0.1, 0.2, 1000.0):  # three sound trials, then one that blows up
        study.enqueue_trial({"embedding_optimizer.lr": lr})
    code = main(["tune", "--dataset", str(dataset), "--out", str(out), "--trials", "4",
                 "--space", str(space), "--no-track", *BASE])
    printed = capsys.readouterr().err  # human output goes to stderr
    assert code == 0, printed
    assert "3 complete, 1 pruned" in printed and "best: trial" in printed
    trials = _study(out).trials
    assert [t.state for t in trials[:3]] == [TrialState.COMPLETE] * 3
    bad = trials[3]
    assert bad.state == TrialState.PRUNED
    full = min(t.user_attrs["steps"] for t in trials[:3])
    # stopped at a validation well before a full run's end, or at the step it diverged
    assert "diverged" in bad.user_attrs or bad.user_attrs["steps"] < full
    best = load_config(out / "best.yaml")
    assert best.embedding_optimizer.lr in (0.05, 0.1, 0.2)


@pytest.mark.parametrize(("space", "metric", "message"), [
    ("model.embeding_dim: {choices: [8, 16]}\n", "val.logloss", "unknown key 'model.embeding_dim'"),
    ("embedding_optimizer.lr: {low: 0.5, high: 0.01}\n", "val.logloss", "low 0.5 is above high 0.01"),
    ("embedding_optimizer.lr: {low: 0.01, high: 0.5}\n", "val.recall", "unknown metric 'val.recall'"),
    ("model.interaction: {choices: [dot, fm]}\n", "val.logloss", "the value 'fm' is not accepted"),
    ("model.dropout: {choices: [0, 0.1, 1.5]}\n", "val.logloss", "the value 1.5 is not accepted"),
])
def test_bad_input_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     space: str, metric: str, message: str) -> None:
    from ctrctl.cli.app import main

    dataset = _dataset(tmp_path / "data")
    code = main(["tune", "--dataset", str(dataset), "--out", str(tmp_path / "tune"),
                 "--space", str(_space(tmp_path, space)), "--metric", metric, "--no-track"])
    err = capsys.readouterr().err
    assert code == 1
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "tune" / "study.db").exists()  # refused before any trial


def test_a_dataset_without_val_says_how_one_is_carved(tmp_path: Path) -> None:
    from ctrctl.errors import ConfigError

    dataset = tmp_path / "data"
    make_dataset(dataset, rows={"train": 500, "test": 50}, num_dense=2, num_sparse=2,
                 num_embeddings=20)
    with pytest.raises(ConfigError, match="no 'val' split.*10% of train is carved"):
        tune(TuneRequest(dataset=dataset, out=tmp_path / "tune", trials=1))


def test_a_searched_embedding_width_carries_the_dense_arch_along() -> None:
    from ctrctl.tuning.space import overrides_for

    base = load_config()  # dense_arch [64, 16], embedding_dim 16
    assert overrides_for(base, {"model.embedding_dim": 8}) == [
        "model.embedding_dim=8", "model.dense_arch=[64, 8]"]
    assert overrides_for(base, {"model.embedding_dim": 32, "model.dense_arch": [128, 64]}) == [
        "model.embedding_dim=32", "model.dense_arch=[128, 64, 32]"]
    assert overrides_for(base, {"model.embedding_dim": 16}) == ["model.embedding_dim=16"]


@pytest.mark.parametrize(("num_dense", "num_sparse", "resolved"), [(0, 2, "dcn"), (4, 8, "dot")])
def test_the_base_trial_takes_the_interaction_auto_resolves_to(
        tmp_path: Path, num_dense: int, num_sparse: int, resolved: str) -> None:
    # The built-in defaults say `interaction: auto`, which the space's choices (dot, dcn) do
    # not hold: the base's trial 0 must still be enqueued, as the interaction auto picks.
    dataset = tmp_path / "data"
    make_dataset(dataset, rows=600, num_dense=num_dense, num_sparse=num_sparse,
                 num_embeddings=50, seed=0)
    assert load_config().model.interaction == "auto"
    result = tune(TuneRequest(dataset=dataset, out=tmp_path / "tune", trials=1, finalists=0,
                              overrides=("training.epochs=1", "training.num_workers=0")))
    base = _study(result.out).trials[0]
    assert base.user_attrs.get("base") is True
    assert base.params["model.interaction"] == resolved
    assert load_config(result.best_yaml).model.interaction == resolved


def test_a_second_search_on_one_folder_is_refused(tmp_path: Path) -> None:
    from ctrctl.errors import OutputLockedError
    from ctrctl.io import output_lock

    dataset = _dataset(tmp_path / "data")
    out = tmp_path / "tune"
    with output_lock(out, "tune"):  # as a running search holds it
        with pytest.raises(OutputLockedError, match="being written by"):
            tune(TuneRequest(dataset=dataset, out=out, trials=1))
    assert not (out / "study.db").exists()
