"""One training or scoring batch: dense features, sparse ids as a KeyedJaggedTensor, labels.

For a batch of B rows with 13 dense and 26 one-hot sparse features::

    dense   (B, 13) float32
    sparse  KeyedJaggedTensor, keys C1..C26, key-major:
              values  = [C1 of rows 0..B-1, C2 of rows 0..B-1, ...]   (26 * B,) int64
              lengths = [1, 1, ..., 1]                                (26 * B,) int32
    labels  (B,) float32 in {0, 1}
    time    (B,) float64 data time in days, or None (datasets whose tables evict by time)

Example:
    >>> batch = next(iter(loader))
    >>> batch = batch.pin_memory().to("cuda", non_blocking=True)
    >>> logits = model(batch.dense, batch.sparse)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ctrctl.sparse import KeyedJaggedTensor

__all__ = ["Batch"]


@dataclass
class Batch:
    """A batch of rows, ready for a model.

    Attributes:
        dense: (B, num_dense) float32.
        sparse: ids per sparse feature, keys in the manifest's order.
        labels: (B,) float32.
        time: (B,) float64 data time of each row in days, where a ``ttl`` managed-collision
            table needs it (None otherwise).
    """

    dense: torch.Tensor
    sparse: KeyedJaggedTensor
    labels: torch.Tensor
    time: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The batch on ``device`` (the same object's tensors when already there)."""
        return Batch(
            dense=self.dense.to(device, non_blocking=non_blocking),
            sparse=self.sparse.to(device, non_blocking=non_blocking),
            labels=self.labels.to(device, non_blocking=non_blocking),
            time=self.time,  # read on the host (the step's data time), never on a device
        )

    def pin_memory(self) -> Batch:
        """The batch in page-locked memory, for asynchronous copies to a GPU."""
        return Batch(
            dense=self.dense.pin_memory(),
            sparse=self.sparse.pin_memory(),
            labels=self.labels.pin_memory(),
            time=self.time,
        )
