"""A trained checkpoint -> a quantized, sharded serving model.

Each table gets a type (``--dtype`` for all, ``--per-table NAME=DTYPE`` for some), its FP32
rows are quantized row-wise (:mod:`ctrctl.modules.quant_embedding`), the tables are placed
on serving shards (:mod:`ctrctl.inference.shard`) and the dense layers are kept FP32 or
converted (``--dense-dtype bf16`` or ``int8``).

Example:
    >>> q = quantize_checkpoint("runs/a", QuantizeConfig(dtype="int8", num_shards=2))
    >>> q.model(dense, ids, lengths)            # (B,) probabilities
    >>> q.table_report[0]                       # {"table": "C1", "fp32_bytes": ..., ...}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ctrctl.config import PipelineConfig
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError
from ctrctl.inference.shard import DEFAULT_REQUEST_SIZE, ServingPlan, place_tables
from ctrctl.inference.sharded_dlrm import DENSE_DTYPES, ShardedDLRM
from ctrctl.modules.dlrm import DLRM
from ctrctl.modules.quant_embedding import (
    QUANT_DTYPES,
    Backend,
    QuantEmbeddingBagCollection,
    QuantTableSpec,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuantizeConfig:
    """How to quantize and place a model.

    Attributes:
        dtype: the type of every table not named in ``per_table``.
        per_table: table -> type.
        num_shards: serving shards (devices or hosts).
        device_memory_bytes: table memory per shard (None: unlimited).
        dense_dtype: ``fp32``, ``bf16`` or ``int8`` (dynamic) for the dense layers.
        request_size: candidates per request, for the placement's costs.
        backend: the embedding kernel ("auto": FBGEMM when it imports).
    """

    dtype: str = "int8"
    per_table: Mapping[str, str] = field(default_factory=dict)
    num_shards: int = 1
    device_memory_bytes: int | None = None
    dense_dtype: str = "fp32"
    request_size: int = DEFAULT_REQUEST_SIZE
    backend: str = "auto"

    def __post_init__(self) -> None:
        for name, dtype in [("--dtype", self.dtype), *self.per_table.items()]:
            if dtype not in QUANT_DTYPES:
                raise ConfigError(f"unknown table type {dtype!r} for {name}",
                                  hint=f"use one of {', '.join(QUANT_DTYPES)}")
        if self.dense_dtype not in DENSE_DTYPES:
            raise ConfigError(f"unknown dense dtype {self.dense_dtype!r}",
                              hint=f"use one of {', '.join(DENSE_DTYPES)}")
        if self.device_memory_bytes is not None and self.device_memory_bytes <= 0:
            raise ConfigError("--device-memory-gb must be more than 0 (no table fits in "
                              f"{self.device_memory_bytes:,} bytes)",
                              hint="leave it out for shards without a memory limit")

    def table_dtype(self, table: str) -> str:
        return self.per_table.get(table, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "per_table": dict(self.per_table),
                "num_shards": self.num_shards, "device_memory_bytes": self.device_memory_bytes,
                "dense_dtype": self.dense_dtype, "request_size": self.request_size,
                "row_alignment": 1, "scale_bias": "fp16 row-wise, at the start of a row"}


def parse_per_table(items: Sequence[str]) -> dict[str, str]:
    """``["C1=int4", "C2=fp16"]`` -> ``{"C1": "int4", "C2": "fp16"}``."""
    out = {}
    for item in items:
        name, sep, dtype = item.partition("=")
        if not sep or not name or not dtype:
            raise ConfigError(f"--per-table {item!r} is not NAME=DTYPE",
                              hint="e.g. --per-table C1=int4")
        out[name.strip()] = dtype.strip().lower()
    return out


@dataclass
class QuantizedModel:
    """A quantized serving model and what made it.

    Attributes:
        model: the serving model.
        plan: the serving placement.
        config: the quantization config.
        manifest: the training dataset's manifest.
        train_config: the checkpoint's resolved pipeline config.
        checkpoint: the checkpoint's step folder.
        table_report: per table: name, rows, dim, dtype, FP32 and quantized bytes, shard.
        training_run_id: the MLflow run that trained the checkpoint, if it recorded one.
        model_uri: the MLflow model logged from the export (``quantize_to_artifact`` with
            tracking on), else None.
    """

    model: ShardedDLRM
    plan: ServingPlan
    config: QuantizeConfig
    manifest: DatasetManifest | None = None
    train_config: PipelineConfig | None = None
    checkpoint: Path | None = None
    table_report: list[dict[str, Any]] = field(default_factory=list)
    training_run_id: str | None = None
    model_uri: str | None = None

    @property
    def fp32_bytes(self) -> int:
        return sum(int(r["fp32_bytes"]) for r in self.table_report)

    @property
    def quantized_bytes(self) -> int:
        return sum(int(r["bytes"]) for r in self.table_report)


def quantize_dlrm(dlrm: DLRM, config: QuantizeConfig,
                  pooling_factors: Mapping[str, float] | None = None
                  ) -> tuple[ShardedDLRM, ServingPlan, list[dict[str, Any]]]:
    """Quantize a DLRM's tables, place them on shards and build the serving model.

    Returns:
        (serving model, serving plan, per-table report).
    """
    configs = dlrm.sparse_arch.embedding_bag_configs()
    names = {c.name for c in configs}
    unknown = sorted(set(config.per_table) - names)
    if unknown:
        raise ConfigError(f"--per-table names tables the model does not have: {unknown}",
                          hint=f"tables: {', '.join(sorted(names)[:12])}")
    specs = [QuantTableSpec(c.name, c.num_embeddings, c.embedding_dim,
                            config.table_dtype(c.name), tuple(c.feature_names))
             for c in configs]
    plan = place_tables(specs, config.num_shards, config.device_memory_bytes,
                        pooling_factors=pooling_factors, request_size=config.request_size)
    weights = {name: w.detach().float().cpu()
               for name, w in dlrm.sparse_arch.embedding_bag_weights().items()}
    by_name = {s.name: s for s in specs}
    backend: Backend = config.backend  # type: ignore[assignment]
    shards = [QuantEmbeddingBagCollection.from_float(
                  [by_name[t] for t in plan.shard_tables(s)],
                  {t: weights[t] for t in plan.shard_tables(s)}, backend=backend)
              for s in range(plan.num_shards)]
    model = ShardedDLRM(dlrm, shards, dense_dtype=config.dense_dtype)
    report = [{"table": s.name, "rows": s.num_embeddings, "dim": s.embedding_dim,
               "dtype": s.dtype, "fp32_bytes": s.num_embeddings * s.embedding_dim * 4,
               "bytes": s.nbytes, "shard": plan.tables[s.name]["shard"]} for s in specs]
    return model, plan, report


def quantize_checkpoint(checkpoint: str | Path, config: QuantizeConfig) -> QuantizedModel:
    """Load a trained checkpoint (any world size) and quantize it for serving.

    Args:
        checkpoint: a training output folder, its ``checkpoints`` folder or a step folder.
        config: how to quantize and place it.
    """
    from ctrctl import checkpoint as ckpt
    from ctrctl.models.scoring import load_model

    dlrm, manifest, train_config = load_model(checkpoint, "cpu")
    if not isinstance(dlrm, DLRM):
        raise ConfigError(f"the checkpoint's model is a {type(dlrm).__name__}, not a DLRM",
                          where=str(checkpoint))
    meta = ckpt.read_metadata(checkpoint)
    factors = {f.name: float(f.mean_length or 1.0) for f in manifest.sparse}
    with torch.no_grad():
        model, plan, report = quantize_dlrm(dlrm, config, factors)
    run_id = meta.extra.get("mlflow_run_id") or meta.extra.get("run_id")
    return QuantizedModel(model=model, plan=plan, config=config, manifest=manifest,
                          train_config=train_config, checkpoint=meta.path,
                          table_report=report,
                          training_run_id=str(run_id) if run_id else None)
