"""What the train loop optimises and validates, per model kind.

* ``dlrm``: BCE with logits on the click labels; validation AUC / logloss
  (:func:`~ctrctl.training.validation.evaluate_model`).
* ``two_tower``: the sampled softmax over in-batch negatives
  (:class:`~ctrctl.modules.two_tower.SampledSoftmaxLoss`); validation recall@K and NDCG@K
  by full ranking of the item catalogue (:func:`~ctrctl.models.two_tower.retrieval_metrics`).

The loop holds one :class:`Objective` and never asks which kind it trains.

Example:
    >>> objective = objective_for(config, Path("dataset"), manifest)
    >>> objective.loss_fn(logits, labels); objective.validate(model, val_loader, device, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from ctrctl.config import PipelineConfig
from ctrctl.data.dataset import BatchLoader
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed.pipeline import TrainPipeline
from ctrctl.models.two_tower import retrieval_metrics
from ctrctl.modules.two_tower import SampledSoftmaxLoss
from ctrctl.training.validation import evaluate_model

__all__ = ["ClickObjective", "Objective", "RetrievalObjective", "objective_for"]


class Objective(Protocol):
    """The loss of a training step and the validation metrics early stopping watches."""

    loss_fn: nn.Module
    #: the validation metric early stopping watches, and whether larger is better
    early_metric: str
    early_direction: str

    def validate(self, model: nn.Module, loader: BatchLoader, device: torch.device,
                 world_size: int, pipeline: TrainPipeline | None) -> dict[str, float]: ...


@dataclass
class ClickObjective:
    """A click model (DLRM): BCE, validated by AUC and logloss."""

    early_metric: str = "logloss"
    early_direction: str = "min"
    loss_fn: nn.Module = field(default_factory=nn.BCEWithLogitsLoss)

    def validate(self, model: nn.Module, loader: BatchLoader, device: torch.device,
                 world_size: int, pipeline: TrainPipeline | None) -> dict[str, float]:
        return evaluate_model(model, loader, device, world_size, pipeline)


@dataclass
class RetrievalObjective:
    """A two-tower model: sampled softmax, validated by full-ranking recall on the
    validation split (every rank computes the same numbers)."""

    dataset: Path
    manifest: DatasetManifest
    split: str
    early_metric: str = "recall@100"
    early_direction: str = "max"
    loss_fn: nn.Module = field(default_factory=SampledSoftmaxLoss)

    def validate(self, model: nn.Module, loader: BatchLoader, device: torch.device,
                 world_size: int, pipeline: TrainPipeline | None) -> dict[str, float]:
        del loader, device, world_size, pipeline  # the towers embed the split's rows
        return retrieval_metrics(model, self.dataset, self.manifest, self.split)


def objective_for(config: PipelineConfig, dataset: Path,
                  manifest: DatasetManifest) -> Objective:
    """The objective of ``config.model.kind``; early stopping's metric from
    ``training.early_stopping`` (a two-tower model watching ``logloss`` or ``auc``, which
    it has not, watches ``recall@100``)."""
    es = config.training.early_stopping
    if config.model.kind == "two_tower":
        metric = es.metric if es.metric.startswith("recall@") else "recall@100"
        direction = es.mode if es.mode != "auto" else "max"
        return RetrievalObjective(dataset, manifest, config.training.val_split, metric,
                                  direction)
    return ClickObjective(es.metric, es.direction)
