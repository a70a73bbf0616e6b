"""Rank bodies that run the real train loop on several processes (for tests).

* :func:`train_body`: :func:`ctrctl.training.loop.train` on this rank under a given plan,
  then the checkpoint it wrote loaded back into a freshly sharded model (the resume path);
  returns every table's full weight as that model holds it.
* :func:`pipeline_resume_body`: per train pipeline, a whole run and a stopped-and-resumed
  one, their checkpoints' full tables (the resume exactness of each pipeline).

Example:
    >>> run_multiprocess(train_body, 2, args=(dataset, out, overrides, plan.to_dict()))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed.checkpoint import gather_table_weights
from ctrctl.distributed.types import ShardingPlan
from ctrctl.models import build as model_io
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


def pipeline_resume_body(rank: int, world_size: int, dataset: str, out: str,
                         overrides: Sequence[str], plan: Mapping[str, Any] | None,
                         pipelines: Sequence[str], stop_after: int) -> dict[str, Any]:
    """Per pipeline: a whole run and a run stopped after ``stop_after`` steps then resumed.

    Returns:
        pipeline -> ``{"whole": tables, "resumed": tables, "history": [...] x2}`` (full
        tables with optimizer state, gathered on every rank).
    """
    sharding = ShardingPlan.from_dict(dict(plan)) if plan else None
    out_root = Path(out)
    results: dict[str, Any] = {}
    for name in pipelines:
        config = load_config(None, [*overrides, f"training.pipeline={name}"])
        whole = train(dataset, out_root / f"{name}-whole", config, plan=sharding)
        train(dataset, out_root / f"{name}-split", config, plan=sharding, stop_after=stop_after)
        resumed = train(dataset, out_root / f"{name}-split", config, plan=sharding, resume=True)
        results[name] = {
            "whole": _saved_tables(whole.checkpoint), "resumed": _saved_tables(resumed.checkpoint),
            "history": [_untimed(whole.history), _untimed(resumed.history)],
            "steps": [whole.step, resumed.step]}
    return results


def _untimed(history: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if "samples_per_s" not in k} for h in history]


def _saved_tables(path: Path) -> dict[str, torch.Tensor]:
    """Every table (and its optimizer state) of a checkpoint, whole, plus the dense state."""
    path = ckpt.resolve_checkpoint(path)
    meta = ckpt.read_metadata(path)
    wanted = [(t, 0, 0, *meta.table_shape(t)) for t in sorted(meta.tables)]
    out: dict[str, torch.Tensor] = {}
    for s in ckpt.load_table_shards(path, wanted):
        out[s.table] = s.weight
        out.update({f"{s.table}.{k}": v for k, v in s.optimizer_state.items()})
    dense, _ = ckpt.load_dense(path)
    out.update({f"dense.{k}": v for k, v in dense.items()})
    return out
