"""``ctrctl eval`` end to end: the real command on small data, its files, exit codes, MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

from ctrctl.errors import CtrctlError
from ctrctl.evaluation.evaluate import training_run_id
from ctrctl.testing.datasets import make_dataset


def run_cli(argv: list[str]) -> int:
    """``ctrctl`` as the console script runs it; returns the exit code."""
    try:
        from ctrctl.cli.app import main
    except ModuleNotFoundError:  # another command's module is not in this checkout yet
        return _eval_only(argv)
    return main(argv)


def _eval_only(argv: list[str]) -> int:
    import typer

    from ctrctl.cli import eval as eval_cli
    from ctrctl.cli.common import console

    app = typer.Typer()
    app.callback()(lambda: None)
    eval_cli.register(app)
    try:
        app(args=argv, prog_name="ctrctl", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    except CtrctlError as exc:
        console.print(f"error: {exc.render()}", highlight=False, soft_wrap=True)
        return exc.exit_code
    return 0


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    """A dataset and a predictions file of its test split (the planted click probabilities)."""
    root = tmp_path_factory.mktemp("eval")
    info = make_dataset(root / "ds", rows={"train": 20_000, "val": 2_000, "test": 5_000},
                        num_dense=2, num_sparse=3, num_embeddings=40, rows_per_file=1_700,
                        row_group_size=500, seed=3)
    labels = np.concatenate([
        pq.read_table(root / "ds" / f, columns=["label"])["label"].to_numpy()
        for f in info.manifest.splits["test"].files
    ])
    scores = info.probs["test"].astype(np.float32)
    pq.write_table(pa.table({"label": labels, "score": scores}), root / "preds.parquet")
    return root / "ds", root / "preds.parquet", labels


def test_eval_writes_metrics_plots_segments_and_predictions(
    scored: tuple[Path, Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset, preds, labels = scored
    out = tmp_path / "out"
    code = run_cli(["eval", "--predictions", str(preds), "--dataset", str(dataset),
                    "--out", str(out), "--segment-by", "C1", "--save-predictions",
                    "--gate", "auc>=0.6", "--gate", "calibration=1+-0.2", "--no-track"])
    assert code == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("auc", "pr_auc", "logloss", "ne", "calibration", "ece", "rows", "label_rate",
                "auc_bound", "auc_mode", "baseline_feature_auc", "auc_lift"):
        assert key in metrics, key
    assert metrics["rows"] == labels.size and metrics["auc_mode"] == "exact"
    # the saved predictions let anyone check the numbers independently
    saved = pq.read_table(out / "predictions").to_pandas()
    assert (saved["label"].to_numpy() == labels).all()
    y, s = saved["label"].to_numpy(), saved["score"].to_numpy().astype(np.float64)
    assert metrics["auc"] == pytest.approx(roc_auc_score(y, s), abs=1e-6)
    assert metrics["pr_auc"] == pytest.approx(average_precision_score(y, s), abs=1e-6)
    assert metrics["logloss"] == pytest.approx(log_loss(y, s), abs=1e-6)
    assert metrics["calibration"] == pytest.approx(s.sum() / y.sum(), rel=1e-6)
    for name in ("reliability.png", "scores.png", "segments/C1.csv", "segments/C1.json",
                 "baselines.json", "gates.json", "reliability.json"):
        assert (out / name).is_file(), name
    segments = json.loads((out / "segments/C1.json").read_text())
    assert sum(r["rows"] for r in segments) == labels.size
    c1 = saved["C1"].to_numpy()
    top = segments[0]
    sel = c1 == top["segment"]
    assert top["rows"] == sel.sum()
    assert top["auc"] == pytest.approx(roc_auc_score(y[sel], s[sel]), abs=1e-6)
    err = capsys.readouterr().err
    assert "AUC" in err and "calibration" in err


def test_failed_gate_exits_2_and_says_by_how_much(
    scored: tuple[Path, Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset, preds, _ = scored
    out = tmp_path / "out"
    code = run_cli(["eval", "--predictions", str(preds), "--dataset", str(dataset),
                    "--out", str(out), "--gate", "auc>=0.99", "--no-track", "--no-baselines"])
    err = capsys.readouterr().err
    assert code == 3
    assert "auc>=0.99: FAILED" in err and "missed by" in err
    assert "PR-AUC" in err  # the summary is printed before the failure
    auc = json.loads((out / "metrics.json").read_text())["auc"]
    assert f"{0.99 - auc:.4g}" in err  # the margin it missed by
    gates = json.loads((out / "gates.json").read_text())
    assert gates[0]["passed"] is False


@pytest.mark.parametrize(("gate", "message"), [("auc>>0.7", "malformed gate"),
                                               ("aucc>=0.7", "unknown metric 'aucc'")])
def test_bad_gate_fails_before_evaluating(
    scored: tuple[Path, Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    gate: str, message: str,
) -> None:
    dataset, preds, _ = scored
    out = tmp_path / "out"
    code = run_cli(["eval", "--predictions", str(preds), "--out", str(out), "--gate", gate,
                    "--no-track"])
    assert code == 1
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_json_goes_to_stdout(
    scored: tuple[Path, Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, preds, labels = scored
    out = tmp_path / "out"
    assert run_cli(["eval", "--predictions", str(preds), "--out", str(out), "--no-track",
                    "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((out / "metrics.json").read_text())
    assert printed["rows"] == labels.size


def test_refuses_to_overwrite_without_the_flag(
    scored: tuple[Path, Path, np.ndarray], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, preds, _ = scored
    out = tmp_path / "out"
    args = ["eval", "--predictions", str(preds), "--out", str(out), "--no-track"]
    assert run_cli(args) == 0
    (out / "marker").write_text("old")
    assert run_cli(args) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "marker").is_file()
    assert run_cli([*args, "--overwrite"]) == 0
    assert not (out / "marker").exists() and (out / "metrics.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_one_class_split_reports_undefined_not_nan(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    preds = tmp_path / "p.parquet"
    pq.write_table(pa.table({"label": np.zeros(100, np.int8),
                             "score": np.full(100, 0.2, np.float32)}), preds)
    out = tmp_path / "out"
    assert run_cli(["eval", "--predictions", str(preds), "--out", str(out), "--no-track"]) == 0
    text = (out / "metrics.json").read_text()
    assert "NaN" not in text
    metrics = json.loads(text)
    assert metrics["auc"] is None and "every row is negative" in metrics["undefined_auc"]
    assert "auc undefined" in capsys.readouterr().err
    code = run_cli(["eval", "--predictions", str(preds), "--out", str(tmp_path / "o2"),
                    "--no-track", "--gate", "auc>=0.5"])
    assert code == 3


def test_mlflow_run_has_metrics_artifacts_and_training_run_tag(
    scored: tuple[Path, Path, np.ndarray], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from ctrctl.evaluation.evaluate import evaluate
    from ctrctl.tracking import make_tracker

    dataset, preds, _ = scored
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "metadata.json").write_text(json.dumps({"extra": {"mlflow_run_id": "abc123"}}))
    assert training_run_id(checkpoint) == "abc123"
    result = evaluate(tmp_path / "out", predictions=preds, dataset=dataset,
                      tracker=make_tracker(True, uri, "eval-test"))
    run = MlflowClient(uri).get_run(result.run_id)
    assert run.data.metrics["auc"] == pytest.approx(result.metrics["auc"])
    assert "logloss" in run.data.metrics and "calibration" in run.data.metrics
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(result.run_id)}
    assert {"metrics.json", "reliability.png", "scores.png"} <= artifacts
    assert run.data.tags["ctrctl.gates"] == "passed"
    # evaluating a checkpoint whose metadata names its training run tags the eval run with it
    import importlib

    evaluate_module = importlib.import_module("ctrctl.evaluation.evaluate")  # not the function
    tagged = evaluate_module._track(make_tracker(True, uri, "eval-test"), tmp_path / "out",
                                    result, checkpoint, "test", ())
    assert MlflowClient(uri).get_run(tagged).data.tags["ctrctl.training_run_id"] == "abc123"


@pytest.mark.slow  # torchrun starts fresh interpreters: ~15 s
@pytest.mark.distributed
def test_two_processes_give_the_one_process_metrics(
    scored: tuple[Path, Path, np.ndarray], tmp_path: Path
) -> None:
    dataset, preds, _ = scored
    common = ["eval", "--predictions", str(preds), "--dataset", str(dataset),
              "--segment-by", "C2", "--no-track"]
    assert run_cli([*common, "--out", str(tmp_path / "one")]) == 0
    code = run_cli([*common, "--out", str(tmp_path / "two"), "--nproc-per-node", "2",
                    "--gate", "auc>=0.99"])
    assert code == 3  # the parent reports the ranks' failed gate
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["world_size"] == 2 and two["rows"] == one["rows"]
    for key in ("auc", "pr_auc", "logloss", "ne", "calibration", "ece", "baseline_feature_auc"):
        assert two[key] == pytest.approx(one[key], rel=1e-12, abs=1e-12), key
    seg_one = json.loads((tmp_path / "one" / "segments" / "C2.json").read_text())
    seg_two = json.loads((tmp_path / "two" / "segments" / "C2.json").read_text())
    assert [r["segment"] for r in seg_one] == [r["segment"] for r in seg_two]
    assert [r["auc"] for r in seg_one] == pytest.approx([r["auc"] for r in seg_two])


def _model_code_present() -> bool:
    """Training needs the model modules; they come from another part of the project."""
    try:
        from ctrctl.modules import DLRM  # noqa: F401
        from ctrctl.training.loop import train  # noqa: F401
    except ImportError:
        return False
    return True


needs_training = pytest.mark.skipif(
    not _model_code_present(), reason="ctrctl.modules.DLRM / training are not importable yet"
)


@pytest.fixture(scope="module")
def criteo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The real Criteo sample, preprocessed and trained for one epoch by the real commands."""
    from tests.conftest import shared_data

    data = shared_data("criteo-kaggle-8k")
    root = tmp_path_factory.mktemp("criteo")
    schema = Path(__file__).resolve().parents[2] / "schemas" / "criteo.yaml"
    pipeline = Path(__file__).resolve().parents[2] / "pipelines" / "small.yaml"
    assert run_cli(["preprocess", "--schema", str(schema),
                    "--input", f"train={data / 'train.csv'}", "--input", f"val={data / 'dev.csv'}",
                    "--input", f"test={data / 'test.csv'}", "--out", str(root / "ds"),
                    "--no-track"]) == 0
    assert run_cli(["train", "--dataset", str(root / "ds"), "--out", str(root / "run"),
                    "--config", str(pipeline), "--no-track", "training.epochs=1"]) == 0
    return root / "ds", root / "run"


@needs_training
def test_criteo_checkpoint_eval_reports_and_a_high_gate_fails(
    criteo_run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset, run = criteo_run
    out = tmp_path / "eval"
    code = run_cli(["eval", "--checkpoint", str(run), "--dataset", str(dataset),
                    "--split", "test", "--out", str(out), "--segment-by", "C6",
                    "--save-predictions", "--gate", "auc>=0.99", "--no-track"])
    err = capsys.readouterr().err
    assert code == 3, err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["rows"] == 391 and metrics["auc_mode"] == "exact"
    assert 0.5 < metrics["auc"] < 0.99
    assert metrics["logloss"] > 0 and metrics["calibration"] > 0
    assert f"auc>=0.99: FAILED, auc={metrics['auc']:.6g}" in err
    assert f"missed by {0.99 - metrics['auc']:.4g}" in err
    # the scores it evaluated, checked independently
    saved = pq.read_table(out / "predictions").to_pandas()
    y, s = saved["label"].to_numpy(), saved["score"].to_numpy().astype(np.float64)
    assert metrics["auc"] == pytest.approx(roc_auc_score(y, s), abs=1e-6)
    assert metrics["logloss"] == pytest.approx(log_loss(y, s), abs=1e-6)
    assert (out / "segments" / "C6.csv").is_file() and (out / "reliability.png").is_file()


@needs_training
@pytest.mark.slow
@pytest.mark.distributed
def test_criteo_checkpoint_two_processes_match_one(
    criteo_run: tuple[Path, Path], tmp_path: Path
) -> None:
    dataset, run = criteo_run
    common = ["eval", "--checkpoint", str(run), "--dataset", str(dataset), "--no-track",
              "--no-baselines"]
    assert run_cli([*common, "--out", str(tmp_path / "one")]) == 0
    assert run_cli([*common, "--out", str(tmp_path / "two"), "--nproc-per-node", "2"]) == 0
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["rows"] == one["rows"]
    for key in ("auc", "pr_auc", "logloss", "calibration", "ece"):
        assert two[key] == pytest.approx(one[key], rel=1e-5), key


@needs_training
@pytest.mark.slow
@pytest.mark.distributed
def test_checkpoint_of_two_ranks_evaluates_on_one_and_three(tmp_path: Path) -> None:
    """World size at training and at evaluation are independent."""
    ds = make_dataset(tmp_path / "ds", {"train": 1200, "val": 300, "test": 301}, num_dense=3,
                      num_sparse=4, num_embeddings=[40, 50, 60, 30], row_group_size=128, seed=5)
    small = ["model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
             "training.batch_size=64", "training.max_steps=12", "training.val_every=0",
             "training.num_workers=1"]
    assert run_cli(["train", "--dataset", str(ds.path), "--out", str(tmp_path / "run"), *small,
                    "--nproc-per-node", "2", "--no-track"]) == 0
    common = ["eval", "--checkpoint", str(tmp_path / "run"), "--no-track", "--segment-by", "C1"]
    assert run_cli([*common, "--out", str(tmp_path / "one"), "--save-predictions"]) == 0
    assert run_cli([*common, "--out", str(tmp_path / "three"), "--nproc-per-node", "3"]) == 0
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    three = json.loads((tmp_path / "three" / "metrics.json").read_text())
    assert one["rows"] == three["rows"] == 301 and three["world_size"] == 3
    for key in ("auc", "pr_auc", "logloss", "calibration", "ece", "baseline_feature_auc"):
        assert three[key] == pytest.approx(one[key], rel=1e-5), key
    saved = pq.read_table(tmp_path / "one" / "predictions").to_pandas()
    y, s = saved["label"].to_numpy(), saved["score"].to_numpy().astype(np.float64)
    assert one["auc"] == pytest.approx(roc_auc_score(y, s), abs=1e-6)
