"""What a new user ran into: flags in the usual places, impossible values refused by the
option's own name before any work, empty inputs refused, the help saying what it should."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrctl.cli.app import hoist_global_flags, main
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError, DatasetError, FormatError
from ctrctl.testing.datasets import make_dataset


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def test_verbose_is_taken_after_the_subcommand_too(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert hoist_global_flags(["synth", "--verbose", "--rows", "5"]) == [
        "--verbose", "synth", "--rows", "5"]
    assert hoist_global_flags(["run", "p.yaml", "--", "-v"]) == ["run", "p.yaml", "--", "-v"]
    code, text = _cli(["synth", "--verbose", "--rows", "50", "--out", str(tmp_path / "s"),
                       "--no-track"], capsys)
    assert code == 0, text
    assert (tmp_path / "s" / "train.tsv").is_file()


@pytest.mark.parametrize("args,option", [
    (["synth", "--rows", "0", "--out", "OUT"], "--rows"),
    (["plan", "--dataset", "DS", "--embedding-dim", "0"], "--embedding-dim"),
    (["eval", "--checkpoint", "missing", "--dataset", "DS", "--out", "OUT",
      "--batch-size", "0"], "--batch-size"),
])
def test_impossible_values_are_refused_by_the_options_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
        option: str) -> None:
    args = [str(tmp_path / a) if a in ("OUT", "DS") else a for a in args]
    code, text = _cli([*args, "--no-track"], capsys)
    assert code == 2 and option in text, text
    assert not (tmp_path / "OUT").exists()


def test_the_library_refuses_the_same_values(tmp_path: Path) -> None:
    from ctrctl.data.synthetic import synthesize
    from ctrctl.evaluation.evaluate import evaluate
    from ctrctl.planning.request import PlanRequest, run_plan

    with pytest.raises(ConfigError, match="--rows must be at least 1"):
        synthesize(tmp_path / "s", rows=0)
    make_dataset(tmp_path / "ds", rows=64, num_dense=2, num_sparse=2, num_embeddings=10)
    with pytest.raises(ConfigError, match="--embedding-dim must be at least 1"):
        run_plan(PlanRequest(dataset=tmp_path / "ds", embedding_dim=0))
    # refused before the (missing) checkpoint is looked at
    with pytest.raises(ConfigError, match="batch_size must be at least 1"):
        evaluate(tmp_path / "e", checkpoint=tmp_path / "missing", dataset=tmp_path / "ds",
                 batch_size=0)


def test_zero_row_predictions_are_an_error(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrctl.evaluation.evaluate import evaluate

    empty = pa.table({"label": pa.array([], pa.int8()), "score": pa.array([], pa.float32())})
    pq.write_table(empty, tmp_path / "p.parquet")
    with pytest.raises(DatasetError, match="no rows"):
        evaluate(tmp_path / "e", predictions=tmp_path / "p.parquet")
    assert not (tmp_path / "e").exists()


def test_an_edited_row_count_in_the_manifest_is_caught(tmp_path: Path) -> None:
    make_dataset(tmp_path / "ds", rows={"train": 300, "val": 50}, num_dense=2, num_sparse=2,
                 num_embeddings=10)
    DatasetManifest.load(tmp_path / "ds")  # as written: fine
    path = tmp_path / "ds" / "manifest.json"
    data = json.loads(path.read_text())
    data["splits"]["train"]["rows"] = 5
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match="'train' records 5 rows but its Parquet files hold 300"):
        DatasetManifest.load(tmp_path / "ds")


def test_help_names_the_environment_and_keeps_brackets(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, text = _cli(["--help"], capsys)
    assert code == 0 and "CTRCTL_DIST_TIMEOUT_S" in text and "CTRCTL_JOIN_TIMEOUT_S" in text
    code, text = _cli(["train", "--help"], capsys)
    assert code == 0 and "CTRCTL_DIST_TIMEOUT_S" in text and "CTRCTL_JOIN_TIMEOUT_S" in text
    code, text = _cli(["run", "--help"], capsys)
    assert code == 0 and "data.inputs=[train=day_0.tsv]" in text, text


@pytest.mark.parametrize("command", [["predict"], ["config", "show"]])
def test_every_command_takes_the_tracking_flags(
        command: list[str], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, text = _cli([*command, "--help"], capsys)
    assert code == 0 and "--tracking-uri" in text and "--no-track" in text, text


def test_config_show_with_no_track(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _cli(["config", "show", "--no-track", "training.epochs=2"], capsys)
    assert code == 0 and "epochs: 2" in text, text


class _Recorded:
    """A tracker that records the runs a command starts and what they log."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, dict[str, object]]] = []

    def run(self, name: str, tags: object = None):  # type: ignore[no-untyped-def]
        import contextlib

        from ctrctl.tracking import Run

        logged: dict[str, object] = {}
        self.runs.append((name, logged))

        class _Run(Run):
            def log_params(self, params) -> None:  # type: ignore[no-untyped-def]
                logged.update(params)

            def log_metrics(self, metrics, step=None) -> None:  # type: ignore[no-untyped-def]
                logged.update(metrics)

        return contextlib.nullcontext(_Run())


def test_predict_tracks_a_run_once_the_scores_are_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ctrctl.cli import predict as predict_cli
    from ctrctl.inference import predictor

    recorded = _Recorded()
    seen: list[tuple[bool, str | None]] = []

    def tracker_from(no_track: bool, uri: str | None, experiment: str,
                     background: bool = False) -> _Recorded:
        seen.append((no_track, uri))
        return recorded

    def scored(model, dataset, split, out, **kwargs):  # type: ignore[no-untyped-def]
        return predictor.PredictResult(out=Path(out), rows=600, seconds=0.5, has_labels=True)

    monkeypatch.setattr(predict_cli, "tracker_from", tracker_from)
    monkeypatch.setattr(predictor, "predict_dataset", scored)
    out = tmp_path / "scores.parquet"
    code, text = _cli(["predict", "--model", str(tmp_path / "m"), "--dataset",
                       str(tmp_path / "ds"), "--out", str(out), "--tracking-uri",
                       "sqlite:///x.db"], capsys)
    assert code == 0, text
    assert seen == [(False, "sqlite:///x.db")]
    assert [name for name, _ in recorded.runs] == ["predict"]
    assert recorded.runs[0][1]["rows"] == 600 and recorded.runs[0][1]["split"] == "test"

    def refused(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise DatasetError("not a serving artifact")

    monkeypatch.setattr(predictor, "predict_dataset", refused)
    code, text = _cli(["predict", "--model", str(tmp_path / "m"), "--dataset",
                       str(tmp_path / "ds"), "--out", str(out)], capsys)
    assert code == 1 and len(recorded.runs) == 1, text
