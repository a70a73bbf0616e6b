"""FBGEMM's table-batched embedding bags (SplitTableBatchedEmbeddingBagsCodegen), wrapped.

One FBGEMM kernel looks up every table of a group in one call and applies the optimizer
inside backward. This wrapper gives it the same small interface as the plain-torch kernel
(:mod:`ctrctl.modules.torch_embedding`): forward(indices, offsets, per_sample_weights),
split_weights(), split_optimizer_states(), set_learning_rate().
fbgemm_gpu is imported only when this kernel is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules.embedding_kernel import table_layout
from ctrctl.modules.optimizers import (
    CPU_OPTIMIZERS,
    EmbeddingOptimizerConfig,
    unsupported_optimizer_error,
)

_OPTIM_NAMES = {
    "exact_rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD",
    "exact_adagrad": "EXACT_ADAGRAD",
    "exact_sgd": "EXACT_SGD",
    "adam": "ADAM",
    "partial_rowwise_adam": "PARTIAL_ROWWISE_ADAM",
    "lamb": "LAMB",
    "partial_rowwise_lamb": "PARTIAL_ROWWISE_LAMB",
    "lars_sgd": "LARS_SGD",
}
_WEIGHT_DECAY_MODES = {"none": "NONE", "l2": "L2", "decoupled": "DECOUPLE"}


def fbgemm_cannot_run(
    tables: Sequence[tuple[int, int]],
    optimizer: EmbeddingOptimizerConfig,
    device: torch.device,
    feature_table_map: Sequence[int] | None = None,
) -> str | None:
    """Why FBGEMM's kernel cannot serve these tables on ``device`` (None when it can)."""
    odd = [d for _, d in tables if d % 4]
    if odd:
        return f"FBGEMM needs embedding dims that are multiples of 4, got {sorted(set(odd))}"
    if device.type == "cpu" and optimizer.weight_decay_mode != "none":
        # Measured: fbgemm-gpu-cpu 1.8.0 accepts weight_decay but its CPU update ignores it.
        return "FBGEMM's CPU kernels ignore embedding weight decay"
    ftm = list(feature_table_map) if feature_table_map is not None else []
    if (
        device.type == "cpu"
        and optimizer.kind == "exact_rowwise_adagrad"
        and any(a > b for a, b in zip(ftm, ftm[1:], strict=False))
    ):
        # fbgemm-gpu-cpu 1.8.0 fails in backward ("num of rows processed by adagrad: 0 does
        # not match c_block size") when a table's features are not contiguous and in order.
        return (
            f"FBGEMM's CPU exact_rowwise_adagrad needs features ordered by table, got "
            f"feature_table_map {ftm}"
        )
    if device.type == "cpu" and optimizer.kind not in CPU_OPTIMIZERS:
        return f"FBGEMM does not run optimizer {optimizer.kind!r} on CPU"
    return None


class FbgemmTableBatchedEmbeddingBags(nn.Module):
    """FBGEMM's TBE over a list of (rows, dim) tables, with a fused optimizer.

    Args:
        tables: (rows, dim) per table; dims must be multiples of 4.
        feature_table_map: the table each feature looks up (default: feature i -> table i).
        optimizer: the fused optimizer.
        pooling: "sum" or "mean".
        device: CPU (host memory) or a CUDA device (HBM).
        data_type: "fp32" or "fp16" weight storage.
        bounds_check: FBGEMM's id bounds check ("warning" clamps bad ids with a warning,
            "fatal" raises, "none" skips it).
        cache_load_factor: keep the tables in host memory (UVM) with this share of their
            rows cached in HBM: FBGEMM's ``EmbeddingLocation.MANAGED_CACHING`` with an LRU
            cache and ``prefetch_pipeline`` (CUDA only; :meth:`prefetch` brings a coming
            batch's rows in, :meth:`cache_counters` reads FBGEMM's cache statistics).
    """

    def __init__(
        self,
        tables: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int] | None = None,
        optimizer: EmbeddingOptimizerConfig | None = None,
        pooling: str = "sum",
        device: torch.device | str | None = None,
        data_type: str = "fp32",
        bounds_check: str = "warning",
        cache_load_factor: float | None = None,
    ) -> None:
        super().__init__()
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            BoundsCheckMode,
            CacheAlgorithm,
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
            WeightDecayMode,
        )

        self.optimizer = optimizer or EmbeddingOptimizerConfig()
        device = torch.device(device or "cpu")
        self.tables, self.feature_table_map = table_layout(
            tables, feature_table_map, "FbgemmTableBatchedEmbeddingBags"
        )
        reason = fbgemm_cannot_run(self.tables, self.optimizer, device, self.feature_table_map)
        if reason is not None:
            if "optimizer" in reason:
                raise unsupported_optimizer_error(self.optimizer.kind, device, "fbgemm")
            raise ConfigError(
                reason, where="FbgemmTableBatchedEmbeddingBags", hint='use backend="torch"'
            )
        self.feature_dims = [self.tables[t][1] for t in self.feature_table_map]
        self.uvm_cache = cache_load_factor is not None
        if self.uvm_cache and device.type != "cuda":
            raise ConfigError(
                "FBGEMM's UVM cache (fused_uvm_caching) runs on CUDA",
                where="FbgemmTableBatchedEmbeddingBags",
                hint="on CPU keep the table on disk with a DRAM cache (fused_cached, "
                     "model.cached_tables)")
        caching: dict[str, Any] = {}
        if device.type == "cpu":
            location, compute = EmbeddingLocation.HOST, ComputeDevice.CPU
        elif self.uvm_cache:
            location, compute = EmbeddingLocation.MANAGED_CACHING, ComputeDevice.CUDA
            caching = {"cache_load_factor": float(cache_load_factor or 0.2),
                       "cache_algorithm": CacheAlgorithm.LRU, "prefetch_pipeline": True,
                       "gather_uvm_cache_stats": True}
        else:
            location, compute = EmbeddingLocation.DEVICE, ComputeDevice.CUDA
        specs = [(rows, dim, location, compute) for rows, dim in self.tables]
        cfg = self.optimizer
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=specs,
            feature_table_map=self.feature_table_map,
            optimizer=getattr(EmbOptimType, _OPTIM_NAMES[cfg.kind]),
            learning_rate=cfg.lr,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            weight_decay_mode=getattr(WeightDecayMode, _WEIGHT_DECAY_MODES[cfg.weight_decay_mode]),
            momentum=cfg.momentum,
            beta1=cfg.beta1,
            beta2=cfg.beta2,
            # Mean pooling runs as a weighted sum (see forward), so the kernel always sums.
            pooling_mode=PoolingMode.SUM,
            weights_precision=SparseType.FP16 if data_type == "fp16" else SparseType.FP32,
            output_dtype=SparseType.FP32,
            bounds_check_mode=getattr(BoundsCheckMode, bounds_check.upper()),
            device=device,
            **caching,
        )
        self.pooling = pooling

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pooled embeddings (B, sum of feature dims); see the plain-torch kernel."""
        if indices.dtype != offsets.dtype:
            indices, offsets = indices.long(), offsets.long()
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.float()
        if self.pooling == "mean":
            # fbgemm-gpu-cpu 1.8.0 with PoolingMode.MEAN and per-sample weights divides by the
            # bag length in forward but not in backward. A sum weighted by w / length is the
            # same forward and has the right gradient, weighted or not.
            lengths = offsets[1:] - offsets[:-1]
            scale = 1.0 / lengths.clamp(min=1).to(torch.float32)
            scale = torch.repeat_interleave(scale, lengths, output_size=indices.numel())
            per_sample_weights = scale if per_sample_weights is None else per_sample_weights * scale
        return self.tbe(indices, offsets, per_sample_weights=per_sample_weights)

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """Bring a coming batch's rows into the HBM cache (UVM caching; else a no-op).

        Call it with the ids the forward will get, on the stream the forward runs on or with
        that stream recorded on the inputs (a train pipeline's prefetch stage)."""
        if self.uvm_cache:
            if indices.dtype != offsets.dtype:
                indices, offsets = indices.long(), offsets.long()
            self.tbe.prefetch(indices, offsets)

    def cache_counters(self) -> dict[str, int]:
        """FBGEMM's UVM cache statistics (all tables together), empty without the cache."""
        if not self.uvm_cache:
            return {}
        stats = self.tbe.get_uvm_cache_stats().tolist()
        names = ["calls", "requested_ids", "unique_ids", "unique_misses",
                 "conflict_unique_misses", "conflict_misses"]
        return {n: int(v) for n, v in zip(names, stats, strict=False)}

    def set_learning_rate(self, lr: float) -> None:
        self.tbe.set_learning_rate(float(lr))

    @property
    def learning_rate(self) -> float:
        return float(self.tbe.get_learning_rate())

    def split_weights(self) -> list[torch.Tensor]:
        """One (rows, dim) view per table into FBGEMM's weight buffer (writes go through)."""
        return list(self.tbe.split_embedding_weights())

    def split_optimizer_states(self) -> list[dict[str, torch.Tensor]]:
        """Per table, its optimizer state as views, named as FBGEMM names them."""
        names = self.optimizer.state_names
        states: Any = self.tbe.split_optimizer_states() if names else [[] for _ in self.tables]
        return [dict(zip(names, per_table, strict=False)) for per_table in states]
