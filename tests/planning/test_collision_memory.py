"""The plan prices managed-collision remappers with their tables (state per row, remap time
per id), not as dense memory on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.data.manifest import DatasetManifest, SparseFeature, SplitInfo
from ctrctl.modules.collisions import REMAP_NS_PER_ID, CollisionConfig
from ctrctl.planning.request import PlanRequest, _resolve, collision_state_bytes


def manifest(zch: bool) -> DatasetManifest:
    user = (SparseFeature("user", "zch", 50_000, collision={"kind": "zch", "capacity": 50_000,
                                                             "eviction": "lru"})
            if zch else SparseFeature("user", "hash", 50_000, hash_size=50_000))
    return DatasetManifest(label="click", dense=(), splits={"train": SplitInfo(1000, 0.2)},
                           sparse=(user, SparseFeature("item", "hash", 300, hash_size=300)))


def test_zch_remappers_are_priced_with_their_tables(tmp_path: Path) -> None:
    assert collision_state_bytes(manifest(False)) == 0
    expected = CollisionConfig(50_000, eviction="lru").state_bytes()
    assert collision_state_bytes(manifest(True)) == expected > 50_000 * 40
    resolved = {}
    for zch in (False, True):
        folder = tmp_path / f"ds-{zch}"
        folder.mkdir()
        manifest(zch).save(folder)
        resolved[zch] = _resolve(PlanRequest(dataset=folder, world_size=2))
    tables = {t.name: t for t in resolved[True][0]}
    assert tables["user"].remap_bytes_per_row == pytest.approx(expected / 50_000)
    assert tables["user"].remap_ns_per_id == REMAP_NS_PER_ID
    assert (tables["item"].remap_bytes_per_row, tables["item"].remap_ns_per_id) == (0, 0)
    assert resolved[True][1].dense_bytes == resolved[False][1].dense_bytes  # not replicated
    assert resolved[True][4]["zch_state_bytes"] == expected
