"""The ``schedule:`` section of a pipeline YAML: ``ctrctl run`` day by day.

With days listed (or synthesised), ``ctrctl run`` trains on each day in turn, warm-started
from the previous day's model, and scores every model on the day after the one it trained
on (progressive validation). See :mod:`ctrctl.runner.schedule`.

Example:
    >>> s = ScheduleConfig.model_validate({"days": ["d1.csv", "d2.csv"], "train_window": 1})
    >>> s.enabled, s.eval
    (True, 'next_day')
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ctrctl.config.base import Section

__all__ = ["PromoteConfig", "ScheduleConfig", "ScheduleSynthConfig"]

#: The comparison arms a schedule can add to its report.
ARMS = ("full_retrain", "frozen")


class PromoteConfig(Section):
    """How each day's registered version is promoted.

    Attributes:
        metric: ``auc`` or ``logloss``: the champion alias moves to a day's version only when
            it beats the champion on that day's next-day rows by more than ``min_gain``,
            both scored in the same run.
        min_gain: the gain that counts as real (a tie keeps the champion).
        gates: absolute gates on the next-day metrics, as ``eval.gates`` (empty: the
            pipeline's ``eval.gates``); the ``candidate`` alias moves when they pass.
    """

    metric: Literal["auc", "logloss"] = "auc"
    min_gain: float = Field(default=0.0, ge=0.0)
    gates: dict[str, float | str] = Field(default_factory=dict)


class ScheduleSynthConfig(Section):
    """Synthetic days (``ctrctl synth --days``) as the schedule's input.

    Attributes:
        days: how many days to write (``day_1.csv`` .. ``day_D.csv``).
        rows_per_day: rows in each day.
        new_ids_per_day: users born each day after the first (items: a quarter of it).
        popularity_drift: the daily decay rate of an id's popularity.
        initial_ids: users on day 1 (items: half of it).
        seed: the same seed gives the same bytes.
    """

    days: int = Field(default=7, ge=2)
    rows_per_day: int = Field(default=20_000, ge=10)
    new_ids_per_day: int = Field(default=2_000, ge=0)
    popularity_drift: float = Field(default=0.3, ge=0.0)
    initial_ids: int = Field(default=5_000, ge=1)
    seed: int = 0


class ScheduleConfig(Section):
    """Day-by-day training (``ctrctl run`` with a schedule).

    Attributes:
        days: one raw log per day, in time order (globs allowed: each match is one day,
            in natural order: ``day_2`` before ``day_10``), so Criteo 1TB's ``day_0`` ..
            ``day_23`` files list as ``[day_*]``. Empty with ``synth``: the synthetic days.
        synth: write synthetic days into ``WORKDIR/raw-days`` and use them.
        train_window: days each model trains on: day d's model trains on days
            ``d-train_window+1 .. d``, warm-started from day d-1's model.
        eval: ``next_day``: day d's model is scored on day d+1 (the last day is only
            scored, never trained on, until a later day is added).
        promote: see :class:`PromoteConfig` (needs ``register.model_name`` and tracking).
        compare: comparison arms for the report: ``full_retrain`` (from scratch on every
            day so far) and ``frozen`` (the first day's model), scored on the same next day.
    """

    days: tuple[str, ...] = ()
    synth: ScheduleSynthConfig | None = None
    train_window: int = Field(default=1, ge=1)
    eval: Literal["next_day"] = "next_day"
    promote: PromoteConfig = PromoteConfig()
    compare: tuple[Literal["full_retrain", "frozen"], ...] = ()

    @model_validator(mode="after")
    def _check(self) -> ScheduleConfig:
        if self.days and self.synth is not None:
            raise ValueError("schedule.days and schedule.synth exclude each other: "
                             "synth writes the days")
        if len(set(self.compare)) != len(self.compare):
            raise ValueError(f"schedule.compare names an arm twice: {list(self.compare)}")
        return self

    @property
    def enabled(self) -> bool:
        """The run is a schedule (days listed or synthesised)."""
        return bool(self.days) or self.synth is not None
