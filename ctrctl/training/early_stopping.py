"""Early stopping: the best validation so far, and when to give up waiting for a better one.

The state is plain numbers so it travels in a checkpoint's ``trainer_state.json``: a run
killed and resumed keeps its best value, best step and count of validations without
improvement, and stops where the uninterrupted run would have.

Example:
    >>> es = EarlyStopping("logloss", "min", patience=2)
    >>> es.update(0.45, step=100), es.update(0.44, step=200), es.update(0.46, step=300)
    (True, True, False)
    >>> es.best_step, es.should_stop
    (200, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EarlyStopping"]


@dataclass
class EarlyStopping:
    """Tracks a validation metric; :attr:`should_stop` once ``patience`` runs out.

    Attributes:
        metric: the validation metric's name (``logloss``, ``auc``).
        mode: ``min`` or ``max``: which way is better.
        patience: validations in a row without improvement before stopping.
        min_delta: an improvement by less than this does not count.
        best: the best value seen (None before the first validation).
        best_step: the step it was seen at.
        bad: validations since the last improvement.
    """

    metric: str
    mode: str
    patience: int
    min_delta: float = 0.0
    best: float | None = None
    best_step: int | None = None
    bad: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be min or max, not {self.mode!r}")

    def improves(self, value: float) -> bool:
        """Whether ``value`` beats the best by more than ``min_delta``."""
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, value: float, step: int) -> bool:
        """Record a validation; True when it is the new best."""
        if self.improves(value):
            self.best, self.best_step, self.bad = float(value), int(step), 0
            return True
        self.bad += 1
        return False

    @property
    def should_stop(self) -> bool:
        """Patience is spent: ``patience`` validations in a row did not improve."""
        return self.bad >= self.patience

    def state(self) -> dict[str, Any]:
        """The state as JSON data (for the checkpoint)."""
        return {"metric": self.metric, "mode": self.mode, "best": self.best,
                "best_step": self.best_step, "bad": self.bad}

    def load_state(self, state: dict[str, Any]) -> None:
        """Put back a state written by :meth:`state` (of the same metric and mode)."""
        if state.get("metric") != self.metric or state.get("mode") != self.mode:
            return  # another criterion: start tracking afresh
        self.best = state.get("best")
        self.best_step = state.get("best_step")
        self.bad = int(state.get("bad", 0))
