"""Synthetic CTR predictions, generated chunk by chunk, for benchmarks and tests of scale.

Rows follow a latent ``x ~ N(0, 1)``: the click probability is ``sigmoid(1.2 x - 3.6)``
(about 5% clicks) and the model's score is ``sigmoid(x - 3.4)`` in float32, so the scores rank
well but not perfectly and are slightly miscalibrated, like a real CTR model's. Chunk ``i`` is
seeded by ``(seed, i)``: the same rows come out whatever is held in memory at once.

Example:
    >>> for labels, scores in synthetic_predictions(10_000_000, chunk_rows=1 << 20):
    ...     accumulator.update(labels, scores)
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

BLOCK_ROWS = 1 << 20


def synthetic_predictions(
    rows: int, seed: int = 0, chunk_rows: int = 1 << 20
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(labels int8, scores float32)`` chunks of ``chunk_rows`` totalling ``rows``.

    Rows are generated in blocks of ``BLOCK_ROWS`` seeded by ``(seed, block)``, so the rows do
    not depend on ``chunk_rows``.
    """
    for index, start in enumerate(range(0, rows, BLOCK_ROWS)):
        n = min(BLOCK_ROWS, rows - start)
        rng = np.random.default_rng([seed, index])
        x = rng.standard_normal(n, dtype=np.float32)
        click = 1.0 / (1.0 + np.exp(-(1.2 * x - 3.6)))
        labels = (rng.random(n, dtype=np.float32) < click).astype(np.int8)
        scores = (1.0 / (1.0 + np.exp(-(x - 3.4)))).astype(np.float32)
        for cut in range(0, n, chunk_rows):
            yield labels[cut : cut + chunk_rows], scores[cut : cut + chunk_rows]


def synthetic_arrays(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """All rows of :func:`synthetic_predictions` at once (for the in-memory reference)."""
    chunks = list(synthetic_predictions(rows, seed))
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])
