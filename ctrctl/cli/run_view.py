"""How ``ctrctl run`` shows a run: a live table of the steps, or plain lines.

Both views are :class:`ctrctl.runner.RunObserver`s fed by the runner's events and keep
one row per step (state, duration, key metric) in a :class:`StepTable`:

- :class:`LiveRunView` (a terminal): a rich ``Live`` table redrawn as steps progress, the
  running step's duration ticking and its work's progress bar under the table; the final
  table stays on screen as the summary.
- :class:`PlainRunView` (not a terminal, or ``--plain``): a line as each step starts and
  ends, and the summary table at the end; nothing is redrawn, so logs and CI read cleanly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from ctrctl.cli.common import RichProgress
from ctrctl.runner import RunObserver, RunResult, StepOutcome

#: The runner's status -> the state a row shows.
STATES = {"running": "running", "ran": "done", "skipped": "skipped (cached)",
          "unavailable": "not run", "outside": "outside", "failed": "failed"}
STYLES = {"pending": "dim", "running": "bold yellow", "done": "green",
          "skipped (cached)": "cyan", "not run": "dim", "outside": "dim", "failed": "bold red"}


def metric_text(outcome: StepOutcome) -> str:
    """A step's headline: its key metric, the gate verdict for eval, why it did not run."""
    if outcome.status == "failed":
        return outcome.reason
    pair = outcome.key_metric
    text = ""
    if pair is not None:
        key, value = pair
        text = f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
    if outcome.name == "eval" and "gates_passed" in outcome.summary:
        gates = outcome.summary.get("gates") or []
        if outcome.summary["gates_passed"]:
            verdict = f"gates passed ({len(gates)})" if gates else "no gates"
        else:
            failed = [g.replace(": FAILED, ", " with ") for g in gates if ": FAILED" in g]
            verdict = "gate FAILED: " + "; ".join(failed or gates)
        text = f"{text}, {verdict}" if text else verdict
    if outcome.name == "register" and outcome.summary.get("alias") and outcome.status == "ran":
        moved = outcome.summary.get("alias_moved")
        text += f" (@{outcome.summary['alias']} {'moved' if moved else 'not moved'})"
    return text or outcome.reason


@dataclass
class StepRow:
    """One step as shown: its state, duration and key metric."""

    name: str
    state: str = "pending"
    seconds: float | None = None
    started: float | None = None
    metric: str = ""


class StepTable(RunObserver):
    """One row per step, updated by the runner's events; :meth:`render` draws the table."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.rows: dict[str, StepRow] = {}
        self.title = "ctrctl run"
        self.result: RunResult | None = None

    def run_started(self, name: str, steps: Sequence[str], workdir: Path) -> None:
        self.title = f"ctrctl run {name} ({workdir})"
        self.rows = {step: StepRow(step) for step in steps}

    def _row(self, name: str) -> StepRow:
        return self.rows.setdefault(name, StepRow(name))

    def step_started(self, outcome: StepOutcome) -> None:
        row = self._row(outcome.name)
        row.state, row.started, row.seconds = "running", self.clock(), None

    def step_finished(self, outcome: StepOutcome) -> None:
        row = self._row(outcome.name)
        row.state = STATES.get(outcome.status, outcome.status)
        row.seconds = outcome.seconds if outcome.status in ("ran", "failed") else None
        row.started = None
        row.metric = metric_text(outcome)

    def run_finished(self, result: RunResult) -> None:
        self.result = result

    def render(self) -> Table:
        """The table as it stands (a running step's duration counts up)."""
        table = Table(title=self.title, title_justify="left")
        table.add_column("step")
        table.add_column("state")
        table.add_column("seconds", justify="right")
        table.add_column("key metric")
        for row in self.rows.values():
            seconds = row.seconds
            if row.state == "running" and row.started is not None:
                seconds = self.clock() - row.started
            style = STYLES.get(row.state, "")
            state = escape(row.state)
            table.add_row(escape(row.name), f"[{style}]{state}[/]" if style else state,
                          "" if seconds is None else f"{seconds:.1f}", escape(row.metric))
        return table


class LiveRunView(StepTable):
    """The step table redrawn in place, with the running step's progress bar under it.

    Use as a context manager around the run; pass :attr:`progress` to the runner.
    """

    def __init__(self, console: Console, refresh_per_second: float = 4,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__(clock)
        self.progress = RichProgress(embedded=True)
        self._live = Live(self, console=console, refresh_per_second=refresh_per_second,
                          transient=False, redirect_stdout=False, redirect_stderr=False)

    def __rich__(self) -> RenderableType:
        bar = self.progress.renderable
        table = self.render()
        return table if bar is None else Group(table, bar)

    def __enter__(self) -> LiveRunView:
        self._live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.progress.finish()
        self._live.stop()  # draws the final table once more and leaves it on screen

    def step_started(self, outcome: StepOutcome) -> None:
        super().step_started(outcome)
        self._live.refresh()

    def step_finished(self, outcome: StepOutcome) -> None:
        self.progress.finish()  # a bar left by a step ends with it
        super().step_finished(outcome)
        self._live.refresh()


class PlainRunView(StepTable):
    """A line as each step starts and ends; the summary table when the run ends."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.perf_counter):
        super().__init__(clock)
        self.console = console

    def __enter__(self) -> PlainRunView:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def step_started(self, outcome: StepOutcome) -> None:
        super().step_started(outcome)
        self.console.print(f"{outcome.name}: running", markup=False, highlight=False)

    def step_finished(self, outcome: StepOutcome) -> None:
        super().step_finished(outcome)
        if outcome.status == "outside":
            return
        row = self.rows[outcome.name]
        took = f" in {row.seconds:.1f} s" if row.seconds is not None else ""
        metric = f" ({row.metric})" if row.metric else ""
        self.console.print(f"{outcome.name}: {row.state}{took}{metric}", markup=False,
                           highlight=False)

    def run_finished(self, result: RunResult) -> None:
        super().run_finished(result)
        self.console.print(self.render())


def make_view(console: Console, plain: bool) -> LiveRunView | PlainRunView:
    """The live view on a terminal, plain lines when ``plain`` or not a terminal."""
    if plain or not console.is_terminal:
        return PlainRunView(console)
    return LiveRunView(console)
