"""The planner prices a managed-collision table's remapper: its state with the rows that
hold it, its remap time per id in forward compute; the array path prices it alike."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ctrctl.distributed.planner import TableSpec, Topology
from ctrctl.distributed.planner.arrays import PARTS, OptionArrays
from ctrctl.distributed.planner.enumerators import EmbeddingEnumerator
from ctrctl.distributed.planner.suites import random_tables

ROWS, BYTES, NS = 100_000, 57.0, 159.0


def options(table: TableSpec, topo: Topology, batch: int) -> dict[str, object]:
    return {o.label: o.ensure_priced() for o in EmbeddingEnumerator(topo, batch).enumerate(table)}


@pytest.mark.parametrize(("preset", "world"), [("cpu", 4), ("torchrec", 16)])
def test_remapper_adds_its_state_and_time_to_each_shard(preset: str, world: int) -> None:
    topo = Topology.preset(preset, world, min(world, 8))
    batch, pooling = 256, 2.0
    plain = TableSpec("user", ROWS, 64, pooling_factor=pooling)
    zch = dataclasses.replace(plain, remap_bytes_per_row=BYTES, remap_ns_per_id=NS)
    base, priced = options(plain, topo, batch), options(zch, topo, batch)
    assert set(base) == set(priced)
    ids = batch * world * pooling  # the step's ids of the table, over every rank
    for label, option in priced.items():
        before = base[label]
        kind = label.split("/")[0]
        rows = np.asarray(option.rows, dtype=np.float64)  # type: ignore[attr-defined]
        # Brute force, shard by shard: row-split types hold their rows' part of the state
        # and remap their share of the ids; other types are priced the whole remapper.
        held = rows if kind in ("table_wise", "row_wise", "table_row_wise") \
            else np.full_like(rows, ROWS)
        memory = (np.asarray(option.hbm) + np.asarray(option.ddr)  # type: ignore[attr-defined]
                  - np.asarray(before.hbm) - np.asarray(before.ddr))  # type: ignore[attr-defined]
        np.testing.assert_allclose(memory, np.ceil(held * BYTES), atol=1.0, err_msg=label)
        extra = (np.asarray(option.fwd_compute)  # type: ignore[attr-defined]
                 - np.asarray(before.fwd_compute))  # type: ignore[attr-defined]
        np.testing.assert_allclose(extra, ids * held / ROWS * NS * 1e-9, rtol=1e-9,
                                   err_msg=label)
        np.testing.assert_array_equal(option.bwd_comms, before.bwd_comms)  # type: ignore[attr-defined]
    rw = next(o for label, o in priced.items() if label.startswith("row_wise/"))
    # Summed over the row-wise shards: the whole remapper once, every id once.
    assert float(np.sum(rw.rows)) * BYTES == pytest.approx(ROWS * BYTES)  # type: ignore[attr-defined]


def test_array_path_prices_remappers_as_the_enumerator() -> None:
    topo = Topology.preset("cpu", 4, 2)
    tables = random_tables(6, seed=3)
    tables = [dataclasses.replace(t, remap_bytes_per_row=BYTES * (i % 2),
                                  remap_ns_per_id=NS * (i % 2)) for i, t in enumerate(tables)]
    arrays = OptionArrays.build(tables, topo, 1024)
    for t, table in enumerate(tables):
        exact = options(table, topo, 1024)
        mine = {o.label: o for o in (arrays.option(t, int(j))
                                     for j in np.flatnonzero(arrays.valid[t]))}
        assert set(mine) == set(exact), table.name
        for label, option in exact.items():
            for name in PARTS:
                np.testing.assert_allclose(np.asarray(getattr(mine[label], name)),
                                           np.asarray(getattr(option, name)), rtol=1e-9,
                                           err_msg=f"{table.name} {label} {name}")
