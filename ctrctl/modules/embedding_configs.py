"""Embedding table configs: what a table is, independent of how it is stored or sharded.

Example:
    >>> EmbeddingBagConfig(name="t_C1", num_embeddings=100_000, embedding_dim=64,
    ...                    feature_names=["C1"], pooling="sum")
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import torch

from ctrctl.errors import ConfigError

PoolingType = Literal["sum", "mean"]
DataType = Literal["fp32", "fp16"]

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16}


@dataclasses.dataclass(frozen=True)
class EmbeddingBagConfig:
    """One embedding table and the features that look it up.

    Args:
        name: table name (the key of its weights in state dicts and checkpoints).
        num_embeddings: rows.
        embedding_dim: columns (a multiple of 4 for the FBGEMM kernel).
        feature_names: the KJT keys this table serves (one table may serve several).
        pooling: "sum" or "mean" over the ids of a bag.
        data_type: storage precision, "fp32" (or "fp16" with FBGEMM).
        init_min, init_max: uniform init range; default +-sqrt(1 / num_embeddings).

    Example:
        >>> EmbeddingBagConfig("t_user", 1000, 16, ["user_id", "friend_id"])
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...] | list[str]
    pooling: PoolingType = "sum"
    data_type: DataType = "fp32"
    init_min: float | None = None
    init_max: float | None = None

    def __post_init__(self) -> None:
        where = f"EmbeddingBagConfig {self.name!r}"
        object.__setattr__(self, "feature_names", tuple(self.feature_names))
        if self.num_embeddings <= 0 or self.embedding_dim <= 0:
            raise ConfigError(
                f"num_embeddings={self.num_embeddings} and embedding_dim={self.embedding_dim} "
                "must be positive",
                where=where,
            )
        if not self.feature_names:
            raise ConfigError("no feature_names", where=where, hint="name the features it serves")
        if self.pooling not in ("sum", "mean"):
            raise ConfigError(
                f"unknown pooling {self.pooling!r}", where=where, hint="use sum or mean"
            )
        if self.data_type not in DTYPES:
            raise ConfigError(
                f"unknown data_type {self.data_type!r}", where=where, hint="use fp32 or fp16"
            )

    @property
    def init_range(self) -> tuple[float, float]:
        bound = math.sqrt(1.0 / self.num_embeddings)
        low = self.init_min if self.init_min is not None else -bound
        high = self.init_max if self.init_max is not None else bound
        return low, high

    def init_weight(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """A freshly initialised (num_embeddings, embedding_dim) fp32 weight on CPU."""
        low, high = self.init_range
        weight = torch.empty(self.num_embeddings, self.embedding_dim)
        return weight.uniform_(low, high, generator=generator)


def check_unique_names(tables: Sequence[EmbeddingBagConfig]) -> None:
    """Table names and feature names must be unique across a collection."""
    names = [t.name for t in tables]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(f"tables {duplicated} are declared twice", where="EmbeddingBagCollection")
    features = [f for t in tables for f in t.feature_names]
    duplicated = sorted({f for f in features if features.count(f) > 1})
    if duplicated:
        raise ConfigError(
            f"features {duplicated} are served by more than one table",
            where="EmbeddingBagCollection",
            hint="give each feature one table; rename the feature to look up two",
        )
