"""The quantization accuracy experiments that ``scripts/quantize_accuracy.py`` reports and
``tests/inference/test_accuracy.py`` bounds: train FP32, quantize, score the same rows.

Example:
    >>> rows = synthetic_accuracy(tmp / "synthetic", {"train": 10_000, "val": 500,
    ...                                                "test": 4_000}, ("int8", "int4"))
    >>> {r["dtype"]: r["auc_loss"] for r in rows}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.inference.accuracy import dtype_accuracy
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.loop import train

#: Every quantized type ``dtype_accuracy`` scores by default (``int8:bf16``: INT8 tables
#: with a bfloat16 dense part).
ALL_DTYPES = ("fp16", "fp8", "int8", "int4", "int2", "int8:bf16")


def criteo_sample_accuracy(folder: Path, work: Path, checkout: Path,
                           dtypes: Sequence[str] = ALL_DTYPES) -> list[dict[str, Any]]:
    """The Criteo 8k-row sample: vocabularies (min_count 10), pipelines/criteo-sample.yaml.

    Args:
        folder: the sample (train.csv, dev.csv, test.csv); scored on dev + test.
        work: a scratch folder for the dataset and the run.
        checkout: the repository root (its schemas/ and pipelines/).
        dtypes: the quantized types to score besides FP32.
    """
    schema = yaml.safe_load((checkout / "schemas" / "criteo.yaml").read_text())
    for column in schema["columns"]:
        if column.get("role") == "sparse":
            column.pop("hash_size", None)
            column["min_count"] = 10
    (work / "schema.yaml").write_text(yaml.safe_dump(schema))
    dataset = work / "criteo"
    preprocess(work / "schema.yaml", [f"train={folder / 'train.csv'}",
                                      f"val={folder / 'dev.csv'}",
                                      f"test={folder / 'test.csv'}"], dataset)
    result = train(dataset, work / "criteo-run",
                   load_config(checkout / "pipelines" / "criteo-sample.yaml"))
    return dtype_accuracy(result.checkpoint, dataset, ("val", "test"), dtypes)


def synthetic_accuracy(work: Path, rows: Mapping[str, int],
                       dtypes: Sequence[str] = ALL_DTYPES) -> list[dict[str, Any]]:
    """A planted logistic click model (26 sparse features x 2,000 ids, 13 dense), dim 16.

    Args:
        work: a scratch folder for the dataset and the run.
        rows: rows per split (train, val, test); scored on test.
        dtypes: the quantized types to score besides FP32.
    """
    data = make_dataset(work / "synthetic", dict(rows), num_dense=13, num_sparse=26,
                        num_embeddings=2000, seed=7)
    config = load_config(None, [
        "model.embedding_dim=16", "model.dense_arch=[64,16]", "model.over_arch=[64,1]",
        "training.batch_size=256", "training.epochs=2", "training.val_every=0",
        "training.checkpoint_every=0", "training.num_workers=1", "training.device=cpu"])
    result = train(data.path, work / "synthetic-run", config)
    return dtype_accuracy(result.checkpoint, data.path, ("test",), dtypes)
