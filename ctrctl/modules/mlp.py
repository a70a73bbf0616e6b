"""Multi-layer perceptrons for the dense parts of a CTR model.

Example:
    >>> mlp = MLP(13, [512, 256, 64])            # Linear + ReLU per layer
    >>> mlp(torch.randn(8, 13)).shape            # torch.Size([8, 64])
    >>> head = MLP(64, [256, 1], final_activation=False)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ctrctl.errors import ConfigError


class MLP(nn.Module):
    """Linear layers with ReLU between them (and after the last one unless told not to).

    Args:
        in_features: input width.
        layer_sizes: output width of each layer.
        final_activation: apply ReLU after the last layer too (True for a bottom MLP,
            False for a head that produces logits).
    """

    def __init__(
        self, in_features: int, layer_sizes: Sequence[int], final_activation: bool = True
    ) -> None:
        super().__init__()
        if not layer_sizes or any(size <= 0 for size in layer_sizes) or in_features <= 0:
            raise ConfigError(
                f"MLP sizes must be positive, got in_features={in_features}, "
                f"layer_sizes={list(layer_sizes)}",
                where="MLP",
            )
        layers: list[nn.Module] = []
        widths = [in_features, *layer_sizes]
        for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            layers.append(nn.Linear(n_in, n_out))
            if final_activation or i < len(layer_sizes) - 1:
                # In place: the Linear output is not needed by its backward, only the ReLU output.
                layers.append(nn.ReLU(inplace=True))
        self.layers = nn.Sequential(*layers)
        self.out_features = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # (B, in) -> (B, out)
