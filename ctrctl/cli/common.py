"""What every command shares: option types, the console, progress, tracking, errors."""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgressBar
from rich.text import Text

from ctrctl.progress import LogProgress, Progress
from ctrctl.tracking import Tracker, make_tracker


class OnBadRows(str, enum.Enum):
    """What preprocess does with a malformed row."""

    error = "error"
    skip = "skip"


class LogFormat(str, enum.Enum):
    """Raw log formats ``ctrctl synth`` writes."""

    criteo = "criteo"
    avazu = "avazu"
    two_tower = "two_tower"


class DevicePreset(str, enum.Enum):
    """Devices the planner knows: a CPU rank, TorchRec's GPU defaults, or a GPU model."""

    cpu = "cpu"
    cuda = "cuda"
    a100_40 = "a100-40"
    a100_80 = "a100-80"
    h100 = "h100"
    h200 = "h200"


#: Width of a console that is not a terminal (a pipe, a file, CI): wide enough that tables
#: take their content's width instead of wrapping and truncating at 80 columns.
PIPED_WIDTH = 1000


def _console(stderr: bool) -> Console:
    probe = Console(stderr=stderr)
    if probe.is_terminal or os.environ.get("COLUMNS"):
        return probe
    return Console(stderr=stderr, width=PIPED_WIDTH)


#: Human output goes to stderr; stdout is kept for machine-readable output (--json).
console = _console(stderr=True)
stdout = _console(stderr=False)



def print_error(message: str) -> None:
    """``error: <message>`` on stderr, the message as plain text.

    Error text is not ours (a path, a user's value, a worker's exception with gloo's
    ``[/__w/pytorch/...]`` in it): rich must not read it as markup.
    """
    console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False,
                  soft_wrap=True)


TrackingUri = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        envvar="MLFLOW_TRACKING_URI",
        help="MLflow tracking URI (a server or store); default: sqlite mlflow.db here.",
    ),
]
NoTrack = Annotated[bool, typer.Option("--no-track", help="Do not track this step in MLflow.")]
Experiment = Annotated[
    str, typer.Option("--experiment", envvar="MLFLOW_EXPERIMENT_NAME",
                      help="MLflow experiment name.")
]
Overwrite = Annotated[
    bool, typer.Option("--overwrite", help="Replace an existing output instead of refusing.")
]
def output_folder(value: Path | None) -> Path | None:
    from ctrctl.io import check_output_location

    return None if value is None else check_output_location(value)


def output_file(value: Path | None) -> Path | None:
    from ctrctl.io import check_output_location

    return None if value is None else check_output_location(value, folder=False)


OutDir = Annotated[Path, typer.Option("--out", "-o", callback=output_folder,
                                      help="Output folder.")]
#: An optional output file (checked like OutDir: its folder must be writable).
OutFile = Annotated[Path | None, typer.Option("--out", "-o", callback=output_file,
                                              help="Output file.")]


def locked(out: Path | None, command: str,
           name: str = "") -> contextlib.AbstractContextManager[Any]:
    """Hold ``out``'s output lock while a command writes it (nothing for no output)."""
    from ctrctl.io import output_lock

    return contextlib.nullcontext() if out is None else output_lock(out, command, name)


def tracking_mode(background: bool) -> str:
    """``background`` for a command that may track in the background (a leaf command whose
    runs nobody asks MLflow about while it runs), unless ``CTRCTL_TRACKING_MODE=sync`` or a
    ``ctrctl run`` parent (its steps' run ids are looked up) says otherwise; else ``sync``."""
    from ctrctl.errors import ConfigError
    from ctrctl.tracking import MODE_ENV, MODES, PARENT_RUN_ENV

    chosen = os.environ.get(MODE_ENV) or "background"
    if chosen not in MODES:
        raise ConfigError(f"unknown tracking mode {chosen!r}", where=MODE_ENV,
                          hint=f"use one of {', '.join(MODES)}")
    if not background or os.environ.get(PARENT_RUN_ENV):
        return "sync"
    return chosen


def tracker_from(no_track: bool, tracking_uri: str | None, experiment: str,
                 background: bool = False) -> Tracker:
    """The tracker for a command's flags; ``background``: the command may track in the
    background (see :func:`tracking_mode`), and says on stderr where its run will appear."""
    tracker = make_tracker(enabled=not no_track, tracking_uri=tracking_uri,
                           experiment=experiment, mode=tracking_mode(background))
    from ctrctl.tracking.journal import JournalTracker

    if isinstance(tracker, JournalTracker):
        tracker.announce = lambda line: console.print(line, markup=False, highlight=False,
                                                      soft_wrap=True)
    return tracker


class RichProgress(Progress):
    """A rich progress bar with a rate and extra fields (loss, auc, ...).

    Args:
        embedded: draw nothing itself; another live display (``ctrctl run``'s step table)
            shows :attr:`renderable` (rich allows one live display at a time).
    """

    def __init__(self, embedded: bool = False) -> None:
        self.embedded = embedded
        self._bar: RichProgressBar | None = None
        self._task: Any = None
        self._unit = "it"
        self._estimate = False

    def start(self, description: str, total: float | None = None, unit: str = "it",
              estimate: bool = False) -> None:
        self.finish()
        self._unit = unit
        self._estimate = estimate
        self._bar = RichProgressBar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        if not self.embedded:
            self._bar.start()
        # the description is formatted into "[bold]{...}" markup: a split's name stays text
        self._task = self._bar.add_task(escape(description), total=total, rate="", extra="")

    def advance(self, amount: float = 1, **fields: Any) -> None:
        if self._bar is None:
            return
        task = self._bar.tasks[0]
        speed = task.speed or 0.0
        extra = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items()
        )
        self._bar.update(
            self._task, advance=amount, rate=f"{speed:,.0f} {self._unit}/s", extra=extra
        )

    def finish(self, completed: bool = True) -> None:
        if self._bar is not None:
            task = self._bar.tasks[0]
            if completed and task.total is not None and (task.completed > task.total
                                                         or self._estimate):
                self._bar.update(self._task, total=task.completed)  # the total was an estimate
            if not self.embedded:
                self._bar.stop()
            self._bar = None

    @property
    def renderable(self) -> RichProgressBar | None:
        """The bar of the task in progress (None between tasks)."""
        return self._bar


def make_progress() -> Progress:
    """A rich bar on a terminal, plain log lines otherwise."""
    if console.is_terminal:
        return RichProgress()
    return LogProgress()


def setup_logging(verbose: bool) -> None:
    """Library logs to stderr: INFO normally, DEBUG under --verbose."""
    from rich.logging import RichHandler

    level = logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger("ctrctl")
    root.handlers.clear()
    from ctrctl.distributed.launch import ERROR_DIR_ENV

    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=verbose)
    else:
        # A rank under `launch` logs to stdout, which its launcher shows (stderr is logged).
        handler = logging.StreamHandler(sys.stdout if os.environ.get(ERROR_DIR_ENV)
                                        else sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
