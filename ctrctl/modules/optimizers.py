"""The optimizer fused into embedding backward: its config, and its math in plain torch.

Embedding tables are updated inside backward (as FBGEMM's TBE does), so they never hold a
``.grad`` and the dense optimizer never sees them. Gradients of repeated ids are summed
first ("exact"), then each touched row is updated once:

    exact_sgd               w -= lr * g
    exact_adagrad           acc += g * g                   (per element, acc is (rows, dim))
                            w -= lr * g / (sqrt(acc) + eps)
    exact_rowwise_adagrad   g' = g + wd * w                (weight_decay_mode "l2" only)
                            acc += mean(g' * g') over dim  (one float per row, acc is (rows,))
                            m = lr / (sqrt(acc) + eps)
                            w = c * w - m * g,  c = 1 - m * wd ("l2"), 1 - lr * wd
                            ("decoupled"), 1 (none)

These are FBGEMM's CPU definitions (fbgemm_gpu codegen/genscript/optimizers.py);
:func:`apply_sparse_update` implements them for the plain-torch kernel and the tests hold the
two against each other.

This is the kernel-level setting (FBGEMM's names). The pipeline YAML's
``embedding_optimizer:`` section is :class:`ctrctl.config.EmbeddingOptimizerSection` (the
user's names: ``rowwise_adagrad`` ...), turned into this by
``ctrctl.training.optimizers.embedding_optimizer``.

Example:
    >>> cfg = EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=0.05)
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

from ctrctl.errors import ConfigError

OptimizerKind = Literal[
    "exact_rowwise_adagrad",
    "exact_adagrad",
    "exact_sgd",
    "adam",
    "partial_rowwise_adam",
    "lamb",
    "partial_rowwise_lamb",
    "lars_sgd",
]
WeightDecayMode = Literal["none", "l2", "decoupled"]

#: Optimizers that FBGEMM runs fused on CPU, and that the plain-torch kernel implements.
CPU_OPTIMIZERS: tuple[str, ...] = ("exact_rowwise_adagrad", "exact_adagrad", "exact_sgd")
#: Optimizers that only FBGEMM's CUDA kernels run.
CUDA_ONLY_OPTIMIZERS: tuple[str, ...] = (
    "adam",
    "partial_rowwise_adam",
    "lamb",
    "partial_rowwise_lamb",
    "lars_sgd",
)

#: Names of the per-table optimizer state tensors, as FBGEMM calls them.
STATE_NAMES: dict[str, tuple[str, ...]] = {
    "exact_rowwise_adagrad": ("momentum1",),
    "exact_adagrad": ("momentum1",),
    "exact_sgd": (),
    "adam": ("momentum1", "momentum2"),
    "partial_rowwise_adam": ("momentum1", "momentum2"),
    "lamb": ("momentum1", "momentum2"),
    "partial_rowwise_lamb": ("momentum1", "momentum2"),
    "lars_sgd": ("momentum1",),
}


@dataclasses.dataclass(frozen=True)
class EmbeddingOptimizerConfig:
    """The optimizer fused into the embedding backward.

    Args:
        kind: one of :data:`CPU_OPTIMIZERS` (run everywhere) or :data:`CUDA_ONLY_OPTIMIZERS`
            (FBGEMM on CUDA only).
        lr: learning rate.
        eps: added to the square root of the accumulator (outside it).
        weight_decay: weight decay factor.
        weight_decay_mode: "none", "l2" (added to the gradient) or "decoupled" (shrinks the
            weight by ``lr * weight_decay``); exact_rowwise_adagrad only.
        momentum: for lars_sgd.
        beta1, beta2: for the Adam and LAMB family.

    Example:
        >>> EmbeddingOptimizerConfig(kind="exact_adagrad", lr=0.01, eps=1e-8)
    """

    kind: OptimizerKind = "exact_rowwise_adagrad"
    lr: float = 0.01
    eps: float = 1.0e-8
    weight_decay: float = 0.0
    weight_decay_mode: WeightDecayMode = "none"
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999

    def __post_init__(self) -> None:
        known = CPU_OPTIMIZERS + CUDA_ONLY_OPTIMIZERS
        if self.kind not in known:
            raise ConfigError(
                f"unknown embedding optimizer {self.kind!r}",
                where="EmbeddingOptimizerConfig.kind",
                hint=f"choose one of {', '.join(known)}",
            )
        if self.weight_decay_mode not in ("none", "l2", "decoupled"):
            raise ConfigError(
                f"unknown weight_decay_mode {self.weight_decay_mode!r}",
                where="EmbeddingOptimizerConfig.weight_decay_mode",
                hint="choose none, l2 or decoupled",
            )
        if self.weight_decay and self.weight_decay_mode == "none":
            raise ConfigError(
                f"weight_decay={self.weight_decay} needs a weight_decay_mode",
                where="EmbeddingOptimizerConfig",
                hint='set weight_decay_mode="l2" or "decoupled"',
            )
        if self.weight_decay_mode != "none" and self.kind != "exact_rowwise_adagrad":
            raise ConfigError(
                f"weight decay is implemented for exact_rowwise_adagrad only, not {self.kind}",
                where="EmbeddingOptimizerConfig.weight_decay_mode",
                hint='use kind="exact_rowwise_adagrad" or weight_decay_mode="none"',
            )
        if self.lr < 0 or self.eps < 0:
            raise ConfigError(
                f"lr={self.lr} and eps={self.eps} must not be negative",
                where="EmbeddingOptimizerConfig",
            )

    @property
    def state_names(self) -> tuple[str, ...]:
        return STATE_NAMES[self.kind]


def unsupported_optimizer_error(kind: str, device: torch.device, backend: str) -> ConfigError:
    """The error for an optimizer the chosen kernel cannot run on ``device``."""
    if device.type == "cuda" and backend != "fbgemm":
        hint = (
            f"choose one of {', '.join(CPU_OPTIMIZERS)}, or install the CUDA build of "
            "fbgemm-gpu for the others"
        )
    else:
        hint = f"choose one of {', '.join(CPU_OPTIMIZERS)}, or train on CUDA with fbgemm-gpu"
    return ConfigError(
        f"embedding optimizer {kind!r} does not run on {device.type} with the {backend} kernel",
        where="EmbeddingOptimizerConfig.kind",
        hint=hint,
    )


def state_shapes(kind: str, dim: int) -> dict[str, tuple[int, ...]]:
    """The optimizer state of one row, by name: () a scalar, (dim,) one value per column."""
    if kind == "exact_rowwise_adagrad":
        return {"momentum1": ()}
    if kind == "exact_adagrad":
        return {"momentum1": (dim,)}
    return {}


def init_state(kind: str, rows: int, dim: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Zeroed optimizer state for one flat (rows, dim) weight."""
    return {
        name: torch.zeros(rows, *shape, device=device)
        for name, shape in state_shapes(kind, dim).items()
    }


@torch.no_grad()
def apply_sparse_update(
    config: EmbeddingOptimizerConfig,
    lr: float,
    weight: torch.Tensor,
    state: dict[str, torch.Tensor],
    rows: torch.Tensor,
    grad: torch.Tensor,
) -> None:
    """Update ``weight[rows]`` in place with the summed gradients ``grad`` (one per row).

    Args:
        config: the optimizer.
        lr: the current learning rate (it can change after construction).
        weight: (N, D) weights.
        state: the optimizer state of ``weight`` (see :func:`init_state`), updated in place.
        rows: (U,) distinct row ids.
        grad: (U, D) summed gradient per row.
    """
    w = weight[rows]  # (U, D)
    if config.kind == "exact_sgd":
        weight.index_copy_(0, rows, w - lr * grad)
    elif config.kind == "exact_adagrad":
        acc = state["momentum1"][rows] + grad * grad  # (U, D)
        state["momentum1"].index_copy_(0, rows, acc)
        weight.index_copy_(0, rows, w - lr * grad / (acc.sqrt() + config.eps))
    elif config.kind == "exact_rowwise_adagrad":
        wd = config.weight_decay
        decayed = grad + wd * w if config.weight_decay_mode == "l2" else grad
        acc = state["momentum1"][rows] + (decayed * decayed).mean(dim=1)  # (U,)
        state["momentum1"].index_copy_(0, rows, acc)
        multiplier = (lr / (acc.sqrt() + config.eps)).unsqueeze(1)  # (U, 1)
        if config.weight_decay_mode == "l2":
            correction = 1.0 - multiplier * wd
        elif config.weight_decay_mode == "decoupled":
            correction = torch.full_like(multiplier, 1.0 - lr * wd)
        else:
            correction = torch.ones_like(multiplier)
        weight.index_copy_(0, rows, correction * w - multiplier * grad)
    else:
        raise unsupported_optimizer_error(config.kind, weight.device, "torch")
