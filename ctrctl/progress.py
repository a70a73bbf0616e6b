"""Progress reporting from long library calls, without the library knowing about terminals.

A long call (preprocess, train, eval) takes a ``progress: Progress`` argument and reports to
it; the default :class:`NullProgress` does nothing. The CLI passes a rich progress bar on a
terminal and plain log lines otherwise (see ``ctrctl.cli.common.make_progress``).

Example:
    >>> p = NullProgress()
    >>> p.start("rows", total=1000, unit="rows")
    >>> p.advance(500, loss=0.43)
    >>> p.finish()
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger(__name__)


class Progress:
    """The interface; this base class reports nothing."""

    def start(self, description: str, total: float | None = None, unit: str = "it",
              estimate: bool = False) -> None:
        """Begin a task of ``total`` units (None when unknown); ``estimate``: the total is a
        guess (rows from file sizes) that the count done replaces when the task completes."""

    def advance(self, amount: float = 1, **fields: Any) -> None:
        """Record ``amount`` more units done; ``fields`` are shown beside (loss=..., auc=...)."""

    def finish(self, completed: bool = True) -> None:
        """End the current task: ``completed``, its work is all done (a total that the units
        done passed was an estimate: the final count stands in for it); else an error
        stopped it."""


NullProgress = Progress

#: Metric names ending so are counts (``val.rows``, ``step``): shown as whole numbers.
COUNT_SUFFIXES = ("rows", "step", "steps", "samples", "positives", "count")


def format_value(name: str, value: Any, digits: int = 4) -> str:
    """A metric for a log line or a table: counts whole (``val.rows=2000``), other floats
    with ``digits`` decimals, anything else as ``str``."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int) or (
            isinstance(value, float) and value.is_integer()
            and name.rsplit(".", 1)[-1].endswith(COUNT_SUFFIXES)):
        return f"{int(value)}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


class LogProgress(Progress):
    """Plain log lines at most every ``interval`` seconds: for logs, CI and pipes."""

    def __init__(self, interval: float = 5.0, log: logging.Logger | None = None):
        self.interval = interval
        self.log = log or logger
        self._description = ""
        self._total: float | None = None
        self._unit = "it"
        self._done = 0.0
        self._t0 = 0.0
        self._last = 0.0
        self._estimate = False

    def start(self, description: str, total: float | None = None, unit: str = "it",
              estimate: bool = False) -> None:
        self._description, self._total, self._unit = description, total, unit
        self._estimate = estimate
        self._done = 0.0
        self._t0 = self._last = time.perf_counter()

    def _line(self, fields: dict[str, Any]) -> str:
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        rate = self._done / elapsed
        total = f"/{self._total:,.0f}" if self._total else ""
        extra = "".join(
            f" {k}={v:.4g}" if isinstance(v, float) else f" {k}={v}" for k, v in fields.items()
        )
        return (
            f"{self._description}: {self._done:,.0f}{total} {self._unit} "
            f"({rate:,.0f} {self._unit}/s){extra}"
        )

    def advance(self, amount: float = 1, **fields: Any) -> None:
        self._done += amount
        now = time.perf_counter()
        if now - self._last >= self.interval:
            self._last = now
            self.log.info(self._line(fields))

    def finish(self, completed: bool = True) -> None:
        if self._description:
            if completed and self._total and (self._done > self._total or self._estimate):
                self._total = self._done  # the total was an estimate: the count stands
            self.log.info(self._line({}) + (" done" if completed else " stopped"))
        self._description = ""
