"""Rank bodies for warm-start tests: a warm start, and the original run continued on new data.

* :func:`warm_body`: :func:`ctrctl.training.loop.train` with ``training.init_from``.
* :func:`continued_body`: the reference. The trainer loads the parent's checkpoint through
  the resume path's loader (every block, the fused optimizers' states, the dense weights and
  the dense optimizer's state), then trains on the new dataset from its first batch: the
  original run, continued on new data in the warm start's data order.

Both return the final checkpoint's full tables, optimizer states and dense state, the same
on every rank.

Example:
    >>> run_multiprocess(warm_body, 2, args=(dataset, out, overrides, plan.to_dict()))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ctrctl.config import load_config
from ctrctl.distributed.types import ShardingPlan
from ctrctl.progress import Progress
from ctrctl.testing.training_ranks import _saved_tables
from ctrctl.tracking import Tracker
from ctrctl.training.loop import _Trainer, train

__all__ = ["continued_body", "warm_body"]


def _plan(plan: Mapping[str, Any] | None) -> ShardingPlan | None:
    return ShardingPlan.from_dict(dict(plan)) if plan else None


def warm_body(rank: int, world_size: int, dataset: str, out: str, overrides: Sequence[str],
              plan: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
    """A warm-started run (``overrides`` carry ``training.init_from``)."""
    result = train(dataset, out, load_config(None, overrides), plan=_plan(plan))
    return _saved_tables(result.checkpoint)


def continued_body(rank: int, world_size: int, parent: str, dataset: str, out: str,
                   overrides: Sequence[str], plan: Mapping[str, Any] | None
                   ) -> dict[str, torch.Tensor]:
    """The run that wrote ``parent`` continued on ``dataset`` from its first batch."""
    config = load_config(None, overrides)
    with Tracker().run("train") as run:
        trainer = _Trainer(Path(dataset), Path(out), config, _plan(plan), run, Progress(), None)
        trainer._load_weights(Path(parent))
        trainer.fit()
        path = trainer.save()
    return _saved_tables(path)
