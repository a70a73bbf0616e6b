"""What a run tells whoever watches it: an observer called as the run and its steps progress.

The runner never prints; it calls a :class:`RunObserver` (the CLI renders a live table or
plain lines from these calls, a notebook or a test can record them). Every method has a
no-op default, so an observer overrides only what it needs.

Order of calls in one run::

    run_started(name, steps, workdir)
    step_started(outcome)       # status "running"; only for a step that runs
    step_finished(outcome)      # every step, in order: ran, skipped, unavailable, outside,
                                # or failed (the run then raises)
    run_finished(result)        # only when no step failed

Example:
    >>> class Lines(RunObserver):
    ...     def step_finished(self, outcome):
    ...         print(outcome.name, outcome.status)
    >>> run_pipeline("pipelines/demo.yaml", observer=Lines())
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ctrctl.runner.core import RunResult, StepOutcome


class RunObserver:
    """The interface; this base class ignores every event."""

    def run_started(self, name: str, steps: Sequence[str], workdir: Path) -> None:
        """The config is valid and the steps are about to run, in ``steps`` order."""

    def step_started(self, outcome: StepOutcome) -> None:
        """A step starts running (``outcome.status == "running"``)."""

    def step_finished(self, outcome: StepOutcome) -> None:
        """A step ended: ``ran``, ``skipped``, ``unavailable``, ``outside`` or ``failed``."""

    def run_finished(self, result: RunResult) -> None:
        """Every step ended and none failed."""


class CallbackObserver(RunObserver):
    """Calls ``callback(outcome)`` as each step starts and ends."""

    def __init__(self, callback: Callable[[StepOutcome], None]):
        self.callback = callback

    def step_started(self, outcome: StepOutcome) -> None:
        self.callback(outcome)

    def step_finished(self, outcome: StepOutcome) -> None:
        self.callback(outcome)
