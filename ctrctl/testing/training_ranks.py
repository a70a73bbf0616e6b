"""Rank bodies that run the real train loop on several processes (for tests).

* :func:`train_body`: :func:`ctrctl.training.loop.train` on this rank under a given plan,
  then the checkpoint it wrote loaded back into a freshly sharded model (the resume path);
  returns every table's full weight as that model holds it.

Example:
    >>> run_multiprocess(train_body, 2, args=(dataset, out, overrides, plan.to_dict()))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed.checkpoint import gather_table_weights
from ctrctl.distributed.types import ShardingPlan
from ctrctl.training import model as model_io
from ctrctl.training.loop import train

__all__ = ["train_body"]


def train_body(rank: int, world_size: int, dataset: str, out: str, overrides: Sequence[str],
               plan: Mapping[str, Any]) -> dict[str, Any]:
    """Train on this rank, then reload the final checkpoint into a new sharded model.

    Returns:
        ``{"checkpoint": path, "tables": {table: full weight}}`` (the same on every rank).
    """
    config = load_config(None, overrides)
    sharding = ShardingPlan.from_dict(dict(plan))
    result = train(dataset, out, config, plan=sharding)
    torch.manual_seed(config.training.seed + 1)                 # other initial weights
    fresh = model_io.build_model(config, DatasetManifest.load(dataset), torch.device("cpu"))
    fresh = model_io.wrap_model(fresh, sharding, None)
    model_io.load_tables(fresh, ckpt.read_metadata(result.checkpoint).path,
                         with_optimizer=False)
    return {"checkpoint": str(result.checkpoint), "tables": gather_table_weights(fresh)}
