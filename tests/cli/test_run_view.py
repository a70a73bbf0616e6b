"""`ctrctl run`'s views: the live step table fed by the runner's events, and plain lines."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from ctrctl.cli.app import main
from ctrctl.cli.run_view import LiveRunView, PlainRunView, StepTable, make_view
from ctrctl.runner import STEPS, StepOutcome, run_pipeline
from tests.runner.helpers import DEMO, ROOT, TINY


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _rows(console: Console, table: StepTable) -> dict[str, list[str]]:
    """The rendered table's cells per step, read back from the console's text."""
    console.print(table.render())
    rows = {}
    for line in console.export_text().splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells and cells[0] in STEPS:
            rows[cells[0]] = cells
    return rows


def _terminal() -> Console:
    return Console(record=True, force_terminal=True, width=160, file=io.StringIO())


EVAL_FAILED = StepOutcome("eval", "ran", 0.7, {
    "auc": 0.5871, "gates_passed": False,
    "gates": ["auc>=0.7: FAILED, auc=0.587088 (missed by 0.1129)"]})


def test_live_rows_follow_the_events(tmp_path: Path) -> None:
    console, clock = _terminal(), Clock()
    view = make_view(console, plain=False)
    assert isinstance(view, LiveRunView)
    view.clock = clock
    with view:
        view.run_started("demo", STEPS, tmp_path)
        assert {r[1] for r in _rows(_terminal(), view).values()} == {"pending"}
        view.step_finished(StepOutcome("synth", "unavailable", reason="no synth.format"))
        view.step_finished(StepOutcome("preprocess", "skipped", summary={"rows": 4000},
                                       reason="inputs and settings unchanged"))
        view.step_started(StepOutcome("plan", "running"))
        clock.now += 2.5
        rows = _rows(_terminal(), view)
        assert rows["synth"] == ["synth", "not run", "", "no synth.format"]
        assert rows["preprocess"] == ["preprocess", "skipped (cached)", "", "rows 4000"]
        assert rows["plan"][:3] == ["plan", "running", "2.5"]  # counts up while it runs
        assert rows["train"][1] == "pending"
        view.progress.start("train", total=3200, unit="samples")
        view.progress.advance(256, loss=0.7)
        console.print(view)  # the bar of the running step's work sits under the table
        drawn = console.export_text()
        assert "256/3200" in drawn and "loss=0.7" in drawn
        view.step_finished(StepOutcome("plan", "ran", 0.1, {"world_size": 1}))
        assert view.progress.renderable is None  # the step's bar ends with the step
        view.step_finished(StepOutcome("train", "ran", 3.4, {"val.auc": 0.61554}))
        view.step_finished(EVAL_FAILED)
        view.step_started(StepOutcome("quantize", "running"))
        view.step_finished(StepOutcome("quantize", "failed", 1.25, reason="disk full"))
    rows = _rows(_terminal(), view)
    assert rows["plan"] == ["plan", "done", "0.1", "world_size 1"]
    assert rows["train"] == ["train", "done", "3.4", "val.auc 0.6155"]
    assert rows["eval"] == ["eval", "done", "0.7", "auc 0.5871, gate FAILED: auc>=0.7 with "
                            "auc=0.587088 (missed by 0.1129)"]
    assert rows["quantize"] == ["quantize", "failed", "1.2", "disk full"]
    assert rows["register"][1] == "pending"
    assert "disk full" in console.export_text()  # the live display drew its last frame


def test_not_a_terminal_or_plain_gives_lines_and_a_summary_table(tmp_path: Path) -> None:
    piped = Console(file=io.StringIO(), width=160, record=True)
    assert not piped.is_terminal
    assert isinstance(make_view(piped, plain=False), PlainRunView)
    assert isinstance(make_view(_terminal(), plain=True), PlainRunView)
    view = make_view(piped, plain=False)
    with view:
        view.run_started("demo", STEPS, tmp_path)
        view.step_started(StepOutcome("train", "running"))
        view.step_finished(StepOutcome("train", "ran", 3.4, {"val.auc": 0.61554}))
        view.step_finished(StepOutcome("quantize", "outside", reason="outside --from/--until"))
        view.step_finished(StepOutcome("register", "unavailable", reason="tracking is off"))
        view.run_finished(None)  # type: ignore[arg-type]
    text = piped.export_text()
    lines = text.splitlines()
    assert lines[:3] == ["train: running", "train: done in 3.4 s (val.auc 0.6155)",
                         "register: not run (tracking is off)"]
    assert "\x1b[" not in piped.file.getvalue()  # type: ignore[attr-defined]
    assert "quantize" not in "\n".join(lines[:3])  # a step outside the range prints no line
    summary = _rows(Console(file=io.StringIO(), width=160, record=True), view)
    assert summary["quantize"][1] == "outside" and summary["synth"][1] == "pending"
    assert "│ train" in text  # the summary table at the end


class Recorder(StepTable):
    """The table, plus every event in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    def step_started(self, outcome: StepOutcome) -> None:
        super().step_started(outcome)
        self.events.append((outcome.name, outcome.status))

    def step_finished(self, outcome: StepOutcome) -> None:
        super().step_finished(outcome)
        self.events.append((outcome.name, outcome.status))


def test_a_real_run_reports_each_step_then_skips_them(tmp_path: Path) -> None:
    first = Recorder()
    run_pipeline(DEMO, TINY, workdir=tmp_path / "w", until_step="plan", observer=first)
    assert first.events == [
        ("synth", "running"), ("synth", "ran"), ("preprocess", "running"),
        ("preprocess", "ran"), ("plan", "running"), ("plan", "ran"), ("tune", "outside"),
        ("train", "outside"), ("index", "outside"), ("eval", "outside"), ("quantize", "outside"),
        ("register", "outside")]
    rows = _rows(Console(file=io.StringIO(), width=160, record=True), first)
    assert rows["preprocess"][:2] == ["preprocess", "done"]
    assert rows["preprocess"][3] == "rows 4000" and float(rows["preprocess"][2]) >= 0
    again = Recorder()
    run_pipeline(DEMO, TINY, workdir=tmp_path / "w", until_step="plan", observer=again)
    assert again.events[:3] == [("synth", "skipped"), ("preprocess", "skipped"),
                                ("plan", "skipped")]
    rows = _rows(Console(file=io.StringIO(), width=160, record=True), again)
    assert [rows[s][1] for s in ("synth", "preprocess", "plan")] == ["skipped (cached)"] * 3
    assert rows["plan"][3] == "world_size 1"


def test_the_cli_prints_plain_lines_when_not_a_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["run", str(DEMO), *TINY, "--workdir", str(tmp_path / "w"), "--until",
                 "preprocess", "--no-track"]) == 0
    err = capsys.readouterr().err
    assert "synth: running" in err and "preprocess: done in" in err
    assert "(rows 4000)" in err and "│ preprocess │ done" in err
    assert main(["run", str(DEMO), *TINY, "--workdir", str(tmp_path / "w"), "--until",
                 "preprocess", "--no-track", "--plain"]) == 0
    assert "preprocess: skipped (cached) (rows 4000)" in capsys.readouterr().err
