"""What :func:`ctrctl.training.loop.train` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TrainResult"]


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` did.

    Attributes:
        out: the output folder.
        step: optimizer steps taken in total (including those before a resume).
        checkpoint: the final checkpoint's step folder.
        metrics: the final metrics (``val.auc``, ``val.logloss``, ``train.loss``, ...).
        history: one entry per logged step and validation.
        samples_per_s: training throughput of this run (global samples, partial batches
            counted as their real size).
        stop_reason: ``early_stopping``, ``epochs`` or ``max_steps`` (None: stopped early by
            ``stop_after``, not finished).
        best_step: the step of the best validation (its weights are the final model's when
            early stopping restores them), or None without early stopping.
        cache: what cached tables' caches did, every rank's shards
            (:func:`~ctrctl.training.cache_report.cache_metrics`; empty without them).
        already_finished: a resume found the run finished: nothing was trained.
    """

    out: Path
    step: int
    checkpoint: Path
    metrics: dict[str, float]
    history: list[dict[str, Any]] = field(default_factory=list)
    samples_per_s: float = 0.0
    stop_reason: str | None = None
    best_step: int | None = None
    cache: dict[str, float] = field(default_factory=dict)
    already_finished: bool = False
