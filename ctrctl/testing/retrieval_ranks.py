"""Rank bodies for two-tower tests on several processes.

Example:
    >>> run_multiprocess(two_tower_train_body, 2, args=(dataset, out, overrides))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ctrctl.config import load_config
from ctrctl.training.loop import train

__all__ = ["two_tower_train_body"]


def two_tower_train_body(rank: int, world_size: int, dataset: str, out: str,
                         overrides: Sequence[str]) -> dict[str, Any]:
    """Train a two-tower model on this rank under the default plan; returns the run's
    history (the same on every rank) and its checkpoint."""
    result = train(dataset, out, load_config(None, list(overrides)))
    return {"checkpoint": str(result.checkpoint), "history": result.history}
