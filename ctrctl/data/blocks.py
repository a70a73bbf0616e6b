"""Decoded rows of a dataset window, held in numpy: what :class:`~ctrctl.data.dataset.BatchLoader`
cuts batches from.

For ``rows`` rows with D dense, F1 one-hot and some multi-hot features::

    labels    (rows,)        float32
    dense     (rows, D)      float32
    onehot    (F1, rows)     int64, feature-major (flattens into a KJT's key-major values)
    multihot  per feature (lengths (rows,), offsets (rows + 1,), values (sum(lengths),))
    time      (rows,)        float64 data time in days, or None (only ttl tables need it)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Block", "take_multihot"]


@dataclass
class Block:
    """Decoded rows held in numpy (see the module docstring for the layout)."""

    labels: np.ndarray  # (rows,) float32
    dense: np.ndarray  # (rows, D) float32
    onehot: np.ndarray  # (F1, rows) int64
    multihot: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    time: np.ndarray | None = None  # (rows,) float64

    @property
    def rows(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, start: int, stop: int) -> Block:
        multihot = []
        for lengths, offsets, values in self.multihot:
            lo, hi = int(offsets[start]), int(offsets[stop])
            multihot.append((lengths[start:stop], offsets[start:stop + 1] - lo, values[lo:hi]))
        return Block(self.labels[start:stop], self.dense[start:stop],
                     self.onehot[:, start:stop], multihot,
                     None if self.time is None else self.time[start:stop])

    @staticmethod
    def concat(blocks: Sequence[Block]) -> Block:
        if len(blocks) == 1:
            return blocks[0]
        multihot = []
        for f in range(len(blocks[0].multihot)):
            lengths = np.concatenate([b.multihot[f][0] for b in blocks])
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            multihot.append((lengths, offsets, np.concatenate([b.multihot[f][2] for b in blocks])))
        times = [b.time for b in blocks]
        return Block(
            np.concatenate([b.labels for b in blocks]),
            np.concatenate([b.dense for b in blocks]),
            np.concatenate([b.onehot for b in blocks], axis=1),
            multihot,
            None if any(t is None for t in times) else np.concatenate(times),  # type: ignore[arg-type]
        )


def take_multihot(
    multihot: list[tuple[np.ndarray, np.ndarray, np.ndarray]], index: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Rows ``index`` of jagged (lengths, offsets, values) features."""
    out = []
    for lengths, offsets, values in multihot:
        new_lengths = lengths[index]
        starts = offsets[:-1][index]
        new_offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(new_lengths, out=new_offsets[1:])
        # Position of every new value in the old values: its row's old start plus its place
        # within the row.
        row_of_value = np.repeat(np.arange(len(index)), new_lengths)
        within = np.arange(int(new_offsets[-1])) - new_offsets[:-1][row_of_value]
        out.append((new_lengths, new_offsets, values[starts[row_of_value] + within]))
    return out
