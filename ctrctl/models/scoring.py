"""Scores from a trained checkpoint: the unsharded model, and a split scored in file order.

What ``ctrctl eval`` scores with, and what quantization starts from. A checkpoint written by
any number of ranks under any plan loads here as one unsharded model on one device.

Example:
    >>> model, manifest, config = load_model("runs/a")
    >>> for labels, scores in predict_split("runs/a", "dataset", "test"):
    ...     ...
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ctrctl import checkpoint as ckpt
from ctrctl.config import PipelineConfig, as_saved_before, parse_config
from ctrctl.data.dataset import BatchLoader
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import CheckpointError
from ctrctl.models import build as model_io

__all__ = ["load_model", "predict_split"]


def load_model(
    checkpoint: str | Path, device: torch.device | str = "cpu"
) -> tuple[nn.Module, DatasetManifest, PipelineConfig]:
    """The unsharded model of a checkpoint, in eval mode, whatever world size wrote it.

    Args:
        checkpoint: a training output folder, its ``checkpoints`` folder or a step folder.
        device: where to put the model.

    Returns:
        (model, the manifest of the dataset it was trained on, its resolved config).
    """
    meta = ckpt.read_metadata(checkpoint)
    manifest_data = meta.extra.get("manifest")
    if not manifest_data:
        raise CheckpointError("the checkpoint does not record its dataset manifest",
                              where=str(meta.path))
    manifest = DatasetManifest.from_dict(manifest_data, where=str(meta.path / "metadata.json"))
    config = parse_config(as_saved_before(meta.config), where=str(meta.path / "metadata.json"))
    torch.manual_seed(config.training.seed)
    model = model_io.build_model(config, manifest, torch.device(device))
    model_io.load_tables(model, meta.path, with_optimizer=False)
    dense, _ = ckpt.load_dense(meta.path)
    model_io.load_dense_state(model, dense)
    model.eval()
    return model, manifest, config


def predict_split(
    checkpoint: str | Path,
    dataset: str | Path,
    split: str,
    batch_size: int = 8192,
    rank: int = 0,
    world_size: int = 1,
    *,
    num_workers: int = 2,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Score rank ``rank``'s rows of a split, in file order: (labels, click probabilities).

    Rank ``r`` of ``W`` scores rows ``[r*N//W, (r+1)*N//W)``, so the ranks together score
    every row once.

    Raises:
        CheckpointError: when the dataset's tables do not fit the model's.
    """
    model, trained_on, _ = load_model(checkpoint, device)
    manifest = DatasetManifest.load(dataset)
    if manifest.table_sizes() != trained_on.table_sizes() or (
            manifest.dense_names != trained_on.dense_names):
        raise CheckpointError(
            "the dataset's features or table sizes differ from those the model was trained on",
            where=str(dataset),
            hint="preprocess the data with the training dataset's vocabularies and hash sizes")
    loader = BatchLoader.for_scoring(dataset, split, batch_size, rank=rank,
                                     world_size=world_size, num_workers=num_workers)
    with torch.no_grad():
        for batch in loader.epoch(0):
            batch = batch.to(device)
            scores = torch.sigmoid(model(batch.dense, batch.sparse).float())
            yield batch.labels.cpu().numpy(), scores.cpu().numpy()
