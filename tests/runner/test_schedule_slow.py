"""The day loop end to end on small synthetic days: promotion, incremental reruns, resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ctrctl.errors import CtrctlError
from tests.runner.helpers import ROOT

CONTINUAL = ROOT / "pipelines" / "continual-demo.yaml"
#: The demo schedule made small: a few seconds per day on 2 cores.
SMALL = ("training.batch_size=256", "schedule.compare=[]", "eval.gates={}",
         "schedule.promote.gates={}")
pytestmark = pytest.mark.slow


def _days(folder: Path, count: int, rows: int = 2000) -> list[Path]:
    from ctrctl.data.synthetic_days import synthesize_days

    result = synthesize_days(folder, days=count, rows_per_day=rows, new_ids_per_day=300,
                             initial_ids=1000, seed=1)
    return [result.files[d] for d in range(1, count + 1)]


def _schedule(files: list[Path], *extra: str) -> tuple[str, ...]:
    days = ",".join(str(f) for f in files)
    return (*SMALL, "schedule.synth=null", f"schedule.days=[{days}]", *extra)


def _untracked(files: list[Path], workdir: Path, **kwargs: Any) -> Any:
    from ctrctl.runner import run_pipeline

    return run_pipeline(CONTINUAL, _schedule(files, "register.model_name=null",
                                             "quantize.enabled=false"),
                        workdir=workdir, **kwargs)


def _ran(record: dict[str, Any]) -> set[str]:
    return {step for step, status in record["steps"].items() if status == "ran"}


def test_a_worse_day_keeps_the_champion(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from ctrctl.runner import run_pipeline
    from ctrctl.tracking import make_tracker

    files = _days(tmp_path / "days", 4, rows=6000)
    # a deliberately worse day 3: every label flipped, so its model learns the opposite
    lines = files[2].read_text().splitlines()
    files[2].write_text("\n".join([lines[0]] + [f"{1 - int(line[0])}{line[1:]}"
                                                for line in lines[1:]]) + "\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_pipeline(CONTINUAL, _schedule(files, "register.model_name=daily",
                                               "training.batch_size=128"),
                          workdir=tmp_path / "run", tracking_uri=uri,
                          tracker=make_tracker(tracking_uri=uri, experiment="schedule"))
    client = MlflowClient(tracking_uri=uri)
    day2, day3 = result.days[1], result.days[2]
    assert [d["version"] for d in result.days] == ["1", "2", "3"]
    assert day3["decision"] == "kept" and day3["champion"] == day2["champion"]
    assert day3["candidate_score"] < day3["champion_score"]
    assert str(client.get_model_version_by_alias("daily", "candidate").version) == "3"
    champion = str(client.get_model_version_by_alias("daily", "champion").version)
    assert champion == day2["champion"] != "3"
    tags = client.get_model_version("daily", "3").tags
    assert tags["ctrctl.promotion.decision"] == "kept"
    assert tags["ctrctl.promotion.champion_version"] == champion
    assert float(tags["ctrctl.promotion.candidate_auc"]) < float(
        tags["ctrctl.promotion.champion_auc"])
    # the version is the day's warm start from the day before
    assert client.get_model_version("daily", "3").tags["ctrctl.parent.source"].endswith(
        str(Path("days") / "day-2" / "train"))
    report = tmp_path / "run" / "report"
    assert {p.name for p in report.iterdir()} >= {"days.json", "days.md", "auc.png",
                                                   "ids.png", "train_seconds.png"}
    # the schedule's MLflow run: a figure per day, the report, the champion
    history = client.get_metric_history(result.parent_run_id, "day.auc")
    assert sorted((m.step, m.value) for m in history) == [
        (d["day"], d["auc"]) for d in result.days]
    assert "report" in {a.path for a in client.list_artifacts(result.parent_run_id)}
    assert client.get_run(result.parent_run_id).data.tags["ctrctl.schedule.champion"] == champion


def test_a_rerun_after_a_new_day_runs_only_that_day(tmp_path: Path) -> None:
    files = _days(tmp_path / "days", 4)
    first = _untracked(files[:3], tmp_path / "run")
    assert [_ran(d) for d in first.days] == [{"preprocess", "plan", "train", "eval"}] * 2
    again = _untracked(files, tmp_path / "run")
    assert [d["day"] for d in again.days] == [1, 2, 3]
    assert _ran(again.days[0]) == _ran(again.days[1]) == set()
    assert _ran(again.days[2]) == {"preprocess", "plan", "train", "eval"}
    assert [d["auc"] for d in again.days[:2]] == [d["auc"] for d in first.days]
    assert again.days[2]["scored_on"] == files[3].name


def test_an_interrupted_schedule_resumes_at_the_interrupted_day(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ctrctl.runner.steps as steps

    files = _days(tmp_path / "days", 4)
    real_eval = steps._eval

    def failing_eval(ctx: steps.Context, resume: bool) -> dict[str, Any]:
        if ctx.workdir.name == "day-2":
            raise CtrctlError("injected failure")
        return real_eval(ctx, resume)

    monkeypatch.setattr(steps, "_eval", failing_eval)
    with pytest.raises(CtrctlError, match="step eval failed: injected failure"):
        _untracked(files, tmp_path / "run")
    assert not (tmp_path / "run" / "days" / "day-3").exists()
    monkeypatch.setattr(steps, "_eval", real_eval)
    resumed = _untracked(files, tmp_path / "run")
    assert _ran(resumed.days[0]) == set()
    assert _ran(resumed.days[1]) == {"eval"}  # preprocess and train completed before
    assert _ran(resumed.days[2]) == {"preprocess", "plan", "train", "eval"}
    assert all(d["auc"] is not None for d in resumed.days)
