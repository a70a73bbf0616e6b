"""Reference table sets for tests and benchmarks: Criteo 1TB and synthetic skews.

Every set is deterministic (seeded). The skewed sets are where a planner that only places
each table's fastest option falls behind: a few tables with heavy pooling or huge rows
dominate one rank unless they are split.

Example:
    >>> tables = criteo_1tb(embedding_dim=128)
    >>> len(tables), tables[0].num_embeddings
    (26, 40000000)
"""

from __future__ import annotations

import numpy as np

from ctrctl.distributed.planner.types import TableSpec

#: Criteo 1TB per-feature table sizes (C1..C26), capped at 40M as MLPerf's DLRM uses them.
CRITEO_1TB_ROWS: tuple[int, ...] = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)


def criteo_1tb(embedding_dim: int = 128) -> list[TableSpec]:
    """The 26 Criteo 1TB tables, one id per sample each."""
    return [TableSpec(f"C{i + 1}", rows, embedding_dim)
            for i, rows in enumerate(CRITEO_1TB_ROWS)]


def uniform(num_tables: int = 26, rows: int = 1_000_000, embedding_dim: int = 128
            ) -> list[TableSpec]:
    """Identical tables: the easy case, where every sensible planner ties."""
    return [TableSpec(f"t{i}", rows, embedding_dim) for i in range(num_tables)]


def skewed(num_tables: int = 40, seed: int = 0) -> list[TableSpec]:
    """Log-normal sizes and heavy-tailed pooling factors (a few features with long lists)."""
    rng = np.random.default_rng(seed)
    rows = np.clip(rng.lognormal(12, 2.0, num_tables), 10, 50_000_000).astype(np.int64)
    pooling = np.clip(rng.pareto(1.2, num_tables) * 2 + 1, 1, 200)
    dims = rng.choice([64, 128, 256], num_tables)
    return [TableSpec(f"s{i}", int(rows[i]), int(dims[i]), pooling_factor=float(pooling[i]))
            for i in range(num_tables)]


def few_huge_many_small(num_small: int = 100, num_huge: int = 4, seed: int = 1
                        ) -> list[TableSpec]:
    """A few very large, busy tables beside many small one-hot ones."""
    rng = np.random.default_rng(seed)
    tables = [TableSpec(f"huge{i}", int(rng.integers(30_000_000, 60_000_000)), 128,
                        pooling_factor=float(rng.integers(20, 60))) for i in range(num_huge)]
    tables += [TableSpec(f"small{i}", int(rng.integers(100, 100_000)), 128,
                         pooling_factor=float(rng.uniform(1, 3))) for i in range(num_small)]
    return tables


def random_tables(num_tables: int, seed: int = 0, max_rows: int = 5_000_000
                  ) -> list[TableSpec]:
    """Random sizes, dims and pooling factors, for scale tests."""
    rng = np.random.default_rng(seed)
    return [TableSpec(f"t{i}", int(rng.integers(100, max_rows)),
                      int(rng.choice([32, 64, 128, 256])),
                      pooling_factor=float(rng.uniform(1, 20)))
            for i in range(num_tables)]


SUITES = {
    "uniform": uniform,
    "criteo-1tb": criteo_1tb,
    "skewed": skewed,
    "few-huge-many-small": few_huge_many_small,
}
