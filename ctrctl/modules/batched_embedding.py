"""BatchedEmbeddingBag: a list of (rows, dim) tables looked up in one call, optimizer fused.

The building block under EmbeddingBagCollection and under a sharded rank's local shards.
Input is the TBE layout: all ids of feature 0 first, then feature 1, ... with one offset per
bag (``T * B + 1`` offsets for T features and batch B). Output is (B, sum of feature dims).

Three kernels with the same semantics: FBGEMM's TBE ("fbgemm"), ctrctl's native C kernel
("native", CPU only) and plain torch ("torch"). ``backend="auto"`` takes the native kernel on
CPU when it was built and runs the optimizer (it measures faster than FBGEMM's CPU TBE there:
see the README's Performance section), FBGEMM when fbgemm_gpu imports and supports the tables,
optimizer and device, and plain torch otherwise (saying why, once).

Example:
    >>> bag = BatchedEmbeddingBag([(1000, 16), (50, 8)],
    ...                           optimizer=EmbeddingOptimizerConfig(lr=0.05))
    >>> out = bag(indices, offsets)             # (B, 24)
    >>> out.sum().backward()                    # the rows looked up are updated here
    >>> bag.split_weights()[1].shape            # torch.Size([50, 8])
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from ctrctl.compat import fbgemm_available
from ctrctl.errors import ConfigError
from ctrctl.modules.embedding_kernel import (
    EmbeddingKernel,
    copy_optimizer_states,
    copy_weights,
    table_layout,
)
from ctrctl.modules.fbgemm_embedding import FbgemmTableBatchedEmbeddingBags, fbgemm_cannot_run
from ctrctl.modules.native.embedding import NativeTableBatchedEmbeddingBags, native_cannot_run
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.modules.torch_embedding import TorchTableBatchedEmbeddingBags

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    # mypy holds every kernel class to the Protocol here, whether or not it is built below.
    _KERNELS: tuple[type[EmbeddingKernel], ...] = (
        FbgemmTableBatchedEmbeddingBags, NativeTableBatchedEmbeddingBags,
        TorchTableBatchedEmbeddingBags)

Backend = Literal["auto", "fbgemm", "native", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "fbgemm", "native", "torch")
_warned: set[str] = set()


def _fbgemm_is_cpu_build() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("fbgemm-gpu-cpu")
        return True
    except PackageNotFoundError:
        return False


def resolve_backend(
    backend: str,
    tables: Sequence[tuple[int, int]],
    optimizer: EmbeddingOptimizerConfig,
    device: torch.device,
    data_type: str = "fp32",
    feature_table_map: Sequence[int] | None = None,
) -> str:
    """The kernel ``backend`` means here: "fbgemm", "native" or "torch"."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"unknown embedding backend {backend!r}",
            where="BatchedEmbeddingBag",
            hint=f"choose {', '.join(BACKENDS)}",
        )
    if backend == "native":
        why = native_cannot_run(optimizer, device, data_type)
        if why is not None:
            raise ConfigError(why, where="BatchedEmbeddingBag",
                              hint='use backend="auto", "fbgemm" or "torch"')
        return "native"
    if backend == "auto" and device.type == "cpu" and native_cannot_run(
        optimizer, device, data_type
    ) is None:
        return "native"
    if backend == "torch":
        if data_type != "fp32":
            raise ConfigError(
                f"the plain-torch embedding kernel stores fp32 only, not {data_type}",
                where="BatchedEmbeddingBag",
                hint='use data_type="fp32" or backend="fbgemm"',
            )
        return "torch"
    reason = None if fbgemm_available() else "fbgemm_gpu is not available"
    if reason is None and device.type == "cuda" and _fbgemm_is_cpu_build():
        reason = "the installed fbgemm_gpu is the CPU build"
    if reason is None:
        reason = fbgemm_cannot_run(tables, optimizer, device, feature_table_map)
    if reason is None:
        return "fbgemm"
    if backend == "fbgemm":
        raise ConfigError(reason, where="BatchedEmbeddingBag", hint='use backend="auto" or "torch"')
    if data_type != "fp32":
        raise ConfigError(
            f"{reason}, and the plain-torch kernel stores fp32 only",
            where="BatchedEmbeddingBag",
            hint='use data_type="fp32"',
        )
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("%s: using the plain-torch embedding kernel", reason)
    return "torch"


class BatchedEmbeddingBag(nn.Module):
    """Pooled lookups over several tables in one kernel, with a fused optimizer.

    Args:
        tables: (rows, dim) per table.
        feature_table_map: the table each feature (block of B bags) looks up; default one
            feature per table.
        optimizer: the optimizer fused into backward.
        pooling: "sum" or "mean".
        device: where weights and optimizer state live.
        backend: "auto", "fbgemm", "native" or "torch".
        data_type: "fp32" (or "fp16", FBGEMM only).
        weights: optional initial (rows, dim) weight per table; zeros otherwise.
        bounds_check: FBGEMM's id check, "warning", "fatal" or "none" (ignored by "torch",
            which raises on a bad id).
        cache_load_factor: CUDA only: keep the tables in host memory with this share of
            their rows cached in HBM (FBGEMM's UVM caching, the ``fused_uvm_caching``
            kernel; :meth:`prefetch` brings a coming batch's rows in).

    Example:
        >>> bag = BatchedEmbeddingBag([(10, 4)], feature_table_map=[0, 0], backend="torch")
        >>> bag(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 1, 3])).shape   # (2, 8)
    """

    def __init__(
        self,
        tables: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int] | None = None,
        optimizer: EmbeddingOptimizerConfig | None = None,
        pooling: str = "sum",
        device: torch.device | str | None = None,
        backend: Backend | str = "auto",
        data_type: str = "fp32",
        weights: Sequence[torch.Tensor] | None = None,
        bounds_check: str = "warning",
        cache_load_factor: float | None = None,
    ) -> None:
        super().__init__()
        self.optimizer = optimizer or EmbeddingOptimizerConfig()
        self.device = torch.device(device or "cpu")
        if cache_load_factor is not None:
            backend = "fbgemm"  # UVM caching is FBGEMM's (CUDA)
        self.tables, self.feature_table_map = table_layout(
            tables, feature_table_map, "BatchedEmbeddingBag"
        )
        self.backend = resolve_backend(
            backend, self.tables, self.optimizer, self.device, data_type, self.feature_table_map
        )
        self.kernel: EmbeddingKernel
        if self.backend == "native":
            self.kernel = NativeTableBatchedEmbeddingBags(
                self.tables, self.feature_table_map, self.optimizer, pooling, self.device
            )
        elif self.backend == "fbgemm":
            self.kernel = FbgemmTableBatchedEmbeddingBags(
                self.tables,
                self.feature_table_map,
                self.optimizer,
                pooling,
                self.device,
                data_type,
                bounds_check,
                cache_load_factor,
            )
        else:
            self.kernel = TorchTableBatchedEmbeddingBags(
                self.tables, self.feature_table_map, self.optimizer, pooling, self.device
            )
        self.pooling = pooling
        self.feature_dims = [self.tables[t][1] for t in self.feature_table_map]
        if weights is not None:
            self.load_weights(weights)

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pooled embeddings.

        Args:
            indices: 1-D int64 ids, feature-major.
            offsets: (T * B + 1,) bag boundaries, T = len(feature_table_map).
            per_sample_weights: optional float weight per id (weighted pooling).

        Returns:
            (B, sum of feature dims), features in ``feature_table_map`` order.
        """
        return self.kernel(indices, offsets, per_sample_weights)

    def split_weights(self) -> list[torch.Tensor]:
        """One (rows, dim) tensor per table: views into the kernel's storage (writes go
        through; clone them to keep a snapshot)."""
        return self.kernel.split_weights()

    def load_weights(self, weights: Sequence[torch.Tensor]) -> None:
        """Copy one (rows, dim) tensor per table into the kernel."""
        copy_weights(self.split_weights(), weights, "BatchedEmbeddingBag")

    def optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        """Per table, the fused optimizer's state (views): {"momentum1": (rows,)} for
        exact_rowwise_adagrad, {"momentum1": (rows, dim)} for exact_adagrad, {} for exact_sgd."""
        return self.kernel.split_optimizer_states()

    def load_optimizer_state(self, states: Sequence[dict[str, torch.Tensor]]) -> None:
        """Copy per-table optimizer state (as :meth:`optimizer_state` returns it)."""
        copy_optimizer_states(self.optimizer_state(), states, "BatchedEmbeddingBag")

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """Bring a coming batch's rows into the device cache (FBGEMM's UVM caching on CUDA);
        a no-op for tables held whole on the device or in memory."""
        prefetch = getattr(self.kernel, "prefetch", None)
        if prefetch is not None:
            prefetch(indices, offsets)

    def cache_counters(self) -> dict[str, int]:
        """The device cache's statistics (UVM caching), empty for resident tables."""
        counters = getattr(self.kernel, "cache_counters", None)
        return counters() if counters is not None else {}

    def set_learning_rate(self, lr: float) -> None:
        """Change the fused optimizer's learning rate (for schedules)."""
        self.kernel.set_learning_rate(lr)

    @property
    def learning_rate(self) -> float:
        return float(self.kernel.learning_rate)

    def extra_repr(self) -> str:
        return (
            f"backend={self.backend}, tables={self.tables}, features={len(self.feature_table_map)}, "
            f"pooling={self.pooling}, optimizer={self.optimizer.kind}"
        )
