"""The plan counts managed-collision remappers' state on every rank, beside the dense model."""

from __future__ import annotations

from pathlib import Path

from ctrctl.data.manifest import DatasetManifest, SparseFeature, SplitInfo
from ctrctl.modules.collisions import CollisionConfig
from ctrctl.planning.request import PlanRequest, _resolve, collision_state_bytes


def manifest(zch: bool) -> DatasetManifest:
    user = (SparseFeature("user", "zch", 50_000, collision={"kind": "zch", "capacity": 50_000,
                                                             "eviction": "lru"})
            if zch else SparseFeature("user", "hash", 50_000, hash_size=50_000))
    return DatasetManifest(label="click", dense=(), splits={"train": SplitInfo(1000, 0.2)},
                           sparse=(user, SparseFeature("item", "hash", 300, hash_size=300)))


def test_zch_state_counts_per_rank(tmp_path: Path) -> None:
    assert collision_state_bytes(manifest(False)) == 0
    expected = CollisionConfig(50_000, eviction="lru").state_bytes()
    assert collision_state_bytes(manifest(True)) == expected > 50_000 * 40
    dense = {}
    for zch in (False, True):
        folder = tmp_path / f"ds-{zch}"
        folder.mkdir()
        manifest(zch).save(folder)
        _, topology, *_ = _resolve(PlanRequest(dataset=folder, world_size=2))
        dense[zch] = topology.dense_bytes
    assert dense[True] - dense[False] == expected
