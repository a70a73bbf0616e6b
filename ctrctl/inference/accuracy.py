"""What quantization costs in accuracy: AUC and logloss per table type on the same rows.

Every model scores the same batches of a split: the FP32 checkpoint (the trained model, as
``ctrctl eval`` scores it) and one quantized serving model per type.

Example:
    >>> rows = dtype_accuracy("runs/a", "dataset", "test", ["int8", "int4"])
    >>> rows[1]["auc_loss"]          # FP32 AUC minus INT4 AUC
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.inference.predictor import batch_inputs
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.metrics.functional import log_loss, roc_auc
from ctrctl.models.scoring import load_model


def dtype_accuracy(checkpoint: str | Path, dataset: str | Path,
                   splits: Sequence[str] = ("test",),
                   dtypes: Sequence[str] = ("fp16", "fp8", "int8", "int4", "int2"),
                   batch_size: int = 4096) -> list[dict[str, Any]]:
    """AUC and logloss of the FP32 checkpoint and of each quantized type on ``splits``.

    Args:
        checkpoint: the trained FP32 checkpoint.
        dataset: the dataset folder it was trained on.
        splits: the splits to score (their rows together).
        dtypes: table types; ``TYPE:DENSE`` (e.g. ``int8:bf16``) also sets the dense part's
            type (``--dense-dtype``), FP32 otherwise.
        batch_size: rows per scored batch.

    Returns:
        One row per model (``fp32`` first): dtype, rows, auc, logloss, auc_loss and
        logloss_gain (against FP32), bytes_ratio (quantized table bytes over FP32).
    """
    fp32, _, _ = load_model(checkpoint)
    models = {d: quantize_checkpoint(checkpoint, QuantizeConfig(
                  dtype=d.partition(":")[0], dense_dtype=d.partition(":")[2] or "fp32"))
              for d in dtypes}
    labels: list[np.ndarray] = []
    scores: dict[str, list[np.ndarray]] = {"fp32": [], **{d: [] for d in dtypes}}
    with torch.no_grad():
        for split in splits:
            loader = BatchLoader.for_scoring(dataset, split, batch_size, num_workers=0)
            for batch in loader.epoch(0):
                labels.append(batch.labels.numpy())
                scores["fp32"].append(torch.sigmoid(fp32(batch.dense, batch.sparse)).numpy())
                for d, q in models.items():
                    inputs = batch_inputs(batch, q.model.input_features)
                    scores[d].append(q.model(*inputs).numpy())
    y = np.concatenate(labels)
    rows: list[dict[str, Any]] = []
    for d, parts in scores.items():
        p = np.concatenate(parts).astype(np.float64)
        rows.append({"dtype": d, "rows": int(y.size), "auc": roc_auc(y, p),
                     "logloss": log_loss(y, p),
                     "bytes_ratio": 1.0 if d == "fp32" else
                     models[d].quantized_bytes / models[d].fp32_bytes})
    base_auc, base_logloss = float(rows[0]["auc"]), float(rows[0]["logloss"])
    for row in rows:
        row["auc_loss"] = base_auc - float(row["auc"])
        row["logloss_gain"] = float(row["logloss"]) - base_logloss
    return rows
