"""Validation during training: the model's metrics over a split, on every rank at once.

The same numbers ``ctrctl eval`` reports (:class:`~ctrctl.metrics.CTRMetrics`), computed
inside the train loop between steps, sharded or not.

Example:
    >>> metrics = evaluate_model(model, BatchLoader.for_scoring("dataset", "val", 4096), cpu)
    >>> metrics["auc"]
"""

from __future__ import annotations

from collections.abc import Generator

import torch
import torch.distributed as dist
from torch import nn

from ctrctl.data.batch import Batch
from ctrctl.data.dataset import BatchLoader
from ctrctl.distributed.pipeline import TrainPipeline

__all__ = ["evaluate_model"]


def evaluate_model(
    model: nn.Module,
    loader: BatchLoader,
    device: torch.device,
    world_size: int = 1,
    pipeline: TrainPipeline | None = None,
) -> dict[str, float]:
    """Validation metrics of ``model`` over a scoring loader, the same as ``ctrctl eval``'s.

    The scores stream into a :class:`~ctrctl.metrics.CTRMetrics` (exact by sorting up to its
    ``exact_limit`` rows, then a histogram with its error bound); with ``world_size > 1``
    each rank scores its slice and the metric's states are combined over the default group
    (torchmetrics' sync), so every rank returns the same numbers. With a ``pipeline`` the
    batches go through its stages (loading ahead, the next batch's ids in flight while one
    scores), as training's do.

    Returns:
        ``rows``, ``logloss`` and, when defined for the rows, ``auc``, ``auc_bound``, ``ne``
        and ``calibration``.
    """
    from ctrctl.metrics.streaming import CTRMetrics

    was_training = model.training
    model.eval()
    metric = CTRMetrics()
    steps = loader.num_batches
    if world_size > 1:
        # A sharded model runs collectives in forward: every rank must take as many steps,
        # though scoring slices may differ by a row (and so by a batch). A rank that runs
        # out repeats its last batch and drops the result.
        count = torch.tensor([steps], dtype=torch.int64)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        steps = int(count.item())
    items = _padded(loader, steps)
    try:
        with torch.no_grad():
            if pipeline is not None:
                for keep, _, logits in pipeline.score(items):
                    if keep[0]:
                        metric.update(keep[1].cpu(), torch.sigmoid(logits.float()).cpu())
            else:
                for keep, batch in items:
                    batch = batch.to(device)
                    logits = model(batch.dense, batch.sparse)
                    if keep[0]:
                        metric.update(keep[1].cpu(), torch.sigmoid(logits.float()).cpu())
    finally:
        items.close()
    model.train(was_training)
    if world_size > 1 and device.type == "cuda":
        metric = metric.to(device)  # NCCL syncs device tensors
    m = metric.compute()
    out = {"rows": float(m.rows)}
    for key in ("auc", "auc_bound", "logloss", "ne", "calibration"):
        value = getattr(m, key)
        if value is not None:
            out[key] = float(value)
    return out


def _padded(loader: BatchLoader, steps: int
            ) -> Generator[tuple[tuple[bool, torch.Tensor], Batch], None, None]:
    """``steps`` items ``((keep, labels), batch)``: the loader's batches, then its last one
    again (``keep`` False) until every rank has taken as many."""
    batches = loader.epoch(0)
    last = None
    try:
        for _ in range(steps):
            batch = next(batches, None)
            keep = batch is not None
            batch = batch if batch is not None else last
            if batch is None:
                return
            last = batch
            yield (keep, batch.labels), batch
    finally:
        batches.close()
