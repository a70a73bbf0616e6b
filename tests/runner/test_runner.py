"""ctrctl run: validation up front, skipping by content hash, failures, the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.errors import ConfigError, CtrctlError, SchemaError
from ctrctl.runner import STEPS, RunObserver, RunResult, StepOutcome, run_pipeline
from tests.runner.helpers import DEMO, ROOT, TINY, tiny_inputs


def _statuses(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {o.name: o.status for o in result.outcomes}


def test_rerun_skips_train_setting_reruns_downstream_input_change_reruns_all(
        tmp_path: Path) -> None:
    overrides = tiny_inputs(tmp_path / "raw")
    work = tmp_path / "work"
    first = run_pipeline(DEMO, overrides, workdir=work)
    ran = {"preprocess": "ran", "plan": "ran", "train": "ran", "eval": "ran"}
    assert {k: v for k, v in _statuses(first).items() if k in ran} == ran
    assert _statuses(first)["synth"] == "unavailable"

    again = run_pipeline(DEMO, overrides, workdir=work)
    assert all(again.outcome(s).status == "skipped" for s in ran)
    assert again.outcome("eval").summary["auc"] == first.outcome("eval").summary["auc"]

    reseeded = run_pipeline(DEMO, (*overrides, "training.seed=1"), workdir=work)
    assert _statuses(reseeded)["preprocess"] == "skipped"
    assert _statuses(reseeded)["plan"] == "skipped"
    assert _statuses(reseeded)["train"] == "ran" and _statuses(reseeded)["eval"] == "ran"

    test_file = tmp_path / "raw" / "test.tsv"
    data = bytearray(test_file.read_bytes())
    data[0] = ord("1") if data[0] == ord("0") else ord("0")  # one label flipped
    test_file.write_bytes(bytes(data))
    changed = run_pipeline(DEMO, (*overrides, "training.seed=1"), workdir=work)
    assert all(changed.outcome(s).status == "ran" for s in ran)


def test_force_reruns_and_from_until_select_a_part(tmp_path: Path) -> None:
    work = tmp_path / "work"
    run_pipeline(DEMO, TINY, workdir=work, until_step="plan")
    assert not (work / "train").exists() and (work / "plan.json").is_file()
    part = run_pipeline(DEMO, TINY, workdir=work, from_step="plan", until_step="plan",
                        force=True)
    assert _statuses(part)["plan"] == "ran"
    assert _statuses(part)["preprocess"] == "outside" and _statuses(part)["train"] == "outside"


class Events(RunObserver):
    """Every event the runner reports, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def run_started(self, name: str, steps, workdir: Path) -> None:  # type: ignore[no-untyped-def]
        self.events.append(("run_started", name, ",".join(steps)))

    def step_started(self, outcome: StepOutcome) -> None:
        self.events.append(("step_started", outcome.name, outcome.status))

    def step_finished(self, outcome: StepOutcome) -> None:
        self.events.append(("step_finished", outcome.name, outcome.status))

    def run_finished(self, result: RunResult) -> None:
        self.events.append(("run_finished", result.config.name, ""))


def test_a_failed_step_stops_the_run_and_a_rerun_continues_from_it(tmp_path: Path) -> None:
    work = tmp_path / "work"
    observer = Events()
    with pytest.raises(CtrctlError, match="step eval failed"):
        run_pipeline(DEMO, (*TINY, "runner.eval_split=nosuchsplit"), workdir=work,
                     observer=observer)
    assert observer.events[0] == ("run_started", "demo", ",".join(STEPS))
    assert observer.events[-2:] == [("step_started", "eval", "running"),
                                    ("step_finished", "eval", "failed")]  # no run_finished
    state = json.loads((work / ".ctrctl" / "state" / "eval.json").read_text())
    assert state["status"] == "failed" and "nosuchsplit" in state["error"]
    assert not (work / "eval").exists()
    rerun = run_pipeline(DEMO, TINY, workdir=work)
    assert _statuses(rerun)["train"] == "skipped" and _statuses(rerun)["eval"] == "ran"


def _pipeline(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, error, where, message", [
    ("name: x\ndata:\n  schema_path: schemas/criteo.yaml\n  inptus: [a]\n", ConfigError,
     "p.yaml:4", "unknown key 'data.inptus'"),
    ("name: x\ndata:\n  schema_path: schemas/criteo.yaml\n  inputs: [train=/no/such.tsv]\n",
     ConfigError, "p.yaml:4", "is not a file"),
    ("name: x\nsynth: {format: criteo}\ndata:\n  schema_path: schemas/criteo.yaml\n"
     "eval:\n  gates: {aucc: 0.7}\n", ConfigError, "p.yaml:6", "gate aucc"),
    ("name: x\nsynth: {format: criteo}\ndata:\n  schema_path: schemas/criteo.yaml\n"
     "plan:\n  world_size: 4\n", ConfigError, "p.yaml:6", "4 ranks but the run starts 1"),
    ("name: x\nsynth: {format: criteo}\ndata:\n  schema_path: BAD\n", SchemaError,
     "p.yaml:4", ""),
])
def test_the_whole_pipeline_is_checked_before_anything_runs(
        tmp_path: Path, text: str, error: type[CtrctlError], where: str, message: str) -> None:
    bad_schema = tmp_path / "bad.yaml"
    bad_schema.write_text("features: [1, 2\n")
    path = _pipeline(tmp_path, text.replace("BAD", str(bad_schema)))
    with pytest.raises(error) as info:
        run_pipeline(path, workdir=tmp_path / "work")
    assert message in info.value.message
    assert where in (info.value.where or "")
    assert not (tmp_path / "work").exists()


def test_demo_through_the_cli_with_mlflow_lineage(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    from ctrctl.runner.lineage import split_files
    from ctrctl.runner.state import tree_sha256

    monkeypatch.chdir(ROOT)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    work = tmp_path / "work"
    args = ["run", str(DEMO), *TINY, "--workdir", str(work), "--tracking-uri", uri,
            "--experiment", "runner-test"]
    assert main(args) == 0
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("runner-test")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("ctrctl.step") == "run"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.tags.get("mlflow.user") and parent.data.tags.get("mlflow.source.name")
    artifacts = [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert "config.yaml" in artifacts
    children = {r.data.tags["ctrctl.step"]: r for r in runs
                if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert {"synth", "preprocess", "plan", "train", "eval"} <= set(children)
    assert children["train"].data.tags.get("mlflow.user")
    # the commit tag: tests/test_tracking_git.py (skipped outside a git checkout)

    dataset = work / "dataset"
    train_sha = tree_sha256(dataset, split_files(dataset, "train"))
    inputs = {(i.dataset.name, [t.value for t in i.tags][0]): i.dataset
              for i in children["train"].inputs.dataset_inputs}
    logged = inputs[("demo/train", "training")]
    assert json.loads(logged.profile)["sha256"] == train_sha
    assert logged.digest == train_sha[:32]
    assert "C1" in logged.schema and str(dataset / "train") in logged.source
    test_inputs = children["eval"].inputs.dataset_inputs
    assert [json.loads(i.dataset.profile)["sha256"] for i in test_inputs] == [
        tree_sha256(dataset, split_files(dataset, "test"))]

    assert main(args) == 0  # unchanged: every step skipped, a child run for each still
    states = [json.loads(p.read_text()) for p in (work / ".ctrctl" / "state").glob("*.json")]
    assert {s["step"] for s in states if s["status"] == "completed"} >= {
        "synth", "preprocess", "plan", "train", "eval"}
    runs = client.search_runs([experiment.experiment_id],
                              filter_string="tags.`ctrctl.skipped` = 'true'")
    assert {r.data.tags["ctrctl.step"] for r in runs} >= {"synth", "preprocess", "plan",
                                                         "train", "eval"}


def test_one_byte_of_a_parquet_file_changes_the_digest(tmp_path: Path) -> None:
    from ctrctl.runner.lineage import split_files, split_sha256

    work = tmp_path / "work"
    run_pipeline(DEMO, TINY, workdir=work, until_step="preprocess")
    dataset = work / "dataset"
    before = split_sha256(dataset, "test")
    target = split_files(dataset, "test")[0]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    assert split_sha256(dataset, "test") != before


def test_gate_fails_on_shuffled_labels(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    overrides = tiny_inputs(raw, rows=8000)
    lines = (raw / "train.tsv").read_text().splitlines()
    labels = [line.split("\t", 1)[0] for line in lines]
    random.Random(0).shuffle(labels)
    (raw / "train.tsv").write_text("".join(
        f"{label}\t{line.split(chr(9), 1)[1]}\n" for label, line in zip(labels, lines,
                                                                         strict=True)))
    result = run_pipeline(DEMO, (*overrides, "eval.gates={auc: 0.6}"), workdir=tmp_path / "w")
    assert not result.gates_passed and result.exit_code == 3
    assert result.outcome("eval").summary["auc"] < 0.6
