"""Train pipelines: the order of a step's stages, and what overlaps what.

See :mod:`ctrctl.distributed.pipeline.base` for the interface and the table of pipelines.

Example:
    >>> pipeline = make_pipeline(choose_pipeline("auto", model), model, optimizer, device)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ctrctl.distributed.pipeline.base import BasePipeline, StepOutput, TrainPipeline
from ctrctl.distributed.pipeline.prefetch import PrefetchPipeline, cached_collections
from ctrctl.distributed.pipeline.semi_sync import SemiSyncPipeline
from ctrctl.distributed.pipeline.sparse_dist import SparseDistPipeline
from ctrctl.distributed.pipeline.trace import Tracer, write_trace
from ctrctl.errors import ConfigError
from ctrctl.modules.collision_collection import ManagedCollisionCollection

__all__ = ["PIPELINES", "BasePipeline", "PrefetchPipeline", "SemiSyncPipeline",
           "SparseDistPipeline", "StepOutput", "TrainPipeline", "Tracer", "choose_pipeline",
           "make_pipeline", "write_trace"]

#: Pipeline name -> class.
PIPELINES: dict[str, type[TrainPipeline]] = {
    p.name: p for p in (BasePipeline, SparseDistPipeline, SemiSyncPipeline, PrefetchPipeline)}


def choose_pipeline(name: str, model: nn.Module) -> str:
    """``auto`` -> the fastest exact pipeline for the model: ``prefetch`` when a table is
    cached, else ``sparse-dist``; any other name is checked and returned."""
    if getattr(model, "splits_features", False):
        # a model that divides its features between several EBCs (two-tower) runs them in
        # its forward; no pipeline can start one EBC's input distribution ahead of it
        if name not in ("auto", "base"):
            raise ConfigError(f"training.pipeline {name!r} cannot run a model that splits "
                              "its features between towers", where="training.pipeline",
                              hint="use auto or base")
        return "base"
    # A batch read ahead would be distributed (or prefetched) with its raw keys, before the
    # model's remappers turn them into rows: zch models step one batch at a time.
    managed = any(isinstance(m, ManagedCollisionCollection) for m in model.modules())
    if name == "auto":
        if managed:
            return "base"
        return "prefetch" if cached_collections(model) else "sparse-dist"
    if name not in PIPELINES:
        raise ConfigError(f"unknown pipeline {name!r}", where="training.pipeline",
                          hint=f"use auto or one of {', '.join(PIPELINES)}")
    if managed and name != "base":
        raise ConfigError(f"the {name} pipeline reads batches ahead, but managed-collision "
                          "tables map a batch's raw keys to rows only in its forward",
                          where="training.pipeline", hint="use training.pipeline: auto or base")
    return name


def make_pipeline(name: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                  device: torch.device, **kwargs: Any) -> TrainPipeline:
    """Build the pipeline ``name`` (``auto`` resolved by :func:`choose_pipeline`).

    Keyword arguments go to the pipeline (``loss_fn``, ``autocast``, ``tracer``, ``group``;
    ``start_step`` for ``semi-sync``).
    """
    cls = PIPELINES[choose_pipeline(name, model)]
    if cls is not SemiSyncPipeline:
        kwargs.pop("start_step", None)
    return cls(model, optimizer, device, **kwargs)
