"""Tables YAML, manifests and topology files: parsed, validated, errors that say where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrctl.data.manifest import DatasetManifest, SparseFeature, SplitInfo
from ctrctl.distributed.planner import (
    TableConstraints,
    Topology,
    tables_from_dict,
    tables_from_manifest,
    tables_from_yaml,
)
from ctrctl.errors import ConfigError, FormatError, PlanError


def test_short_and_long_forms(tmp_path: Path) -> None:
    short = tables_from_dict({"embedding_dim": 64, "num_embeddings_per_feature": [10, 20],
                              "pooling_factor": [1.0, 3.0],
                              "constraints": {"t1": {"sharding_types": ["row_wise"]}}})
    assert [(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor) for t in short] == [
        ("t0", 10, 64, 1.0), ("t1", 20, 64, 3.0)]
    assert short[1].constraints == TableConstraints(sharding_types=("row_wise",))
    path = tmp_path / "tables.yaml"
    path.write_text("tables:\n"
                    "  - {name: user, num_embeddings: 1000, embedding_dim: 32, ranks: [0]}\n"
                    "  - {name: item, num_embeddings: 50, embedding_dim: 16,"
                    " pooling_factor: 7, optimizer: adam}\n")
    long = tables_from_yaml(path)
    assert long[0].constraints.ranks == (0,)
    assert long[1].pooling_factor == 7.0 and long[1].optimizer == "adam"


@pytest.mark.parametrize(("data", "fragment"), [
    ({"tables": [{"name": "a", "num_embeddings": 5, "embedding_dim": 8, "colour": 1}]},
     "unknown keys: colour"),
    ({"tables": [{"name": "a", "num_embeddings": 5, "embedding_dim": 8,
                  "sharding_types": ["diagonal"]}]}, "unknown sharding type"),
    ({"tables": [{"name": "a", "num_embeddings": -5, "embedding_dim": 8}]}, "positive"),
    ({"embedding_dim": 8}, "expected"),
    ({"embedding_dim": 8, "num_embeddings_per_feature": [4],
      "constraints": {"nope": {"ranks": [0]}}}, "unknown tables: nope"),
    ({"tables": [{"name": "a", "num_embeddings": 5, "embedding_dim": 8,
                  "cache_load_factor": 2}]}, "cache_load_factor"),
])
def test_bad_tables_name_the_problem(data: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        tables_from_dict(data, where="tables.yaml")
    assert fragment in info.value.render() and "tables.yaml" in info.value.render()


def test_tables_from_manifest_take_pooling_and_constraints() -> None:
    manifest = DatasetManifest(
        label="label", dense=(),
        sparse=(SparseFeature("a", "hash", 1000, mean_length=2.5),
                SparseFeature("b", "vocab", 30)),
        splits={"train": SplitInfo(rows=10, label_rate=0.5)})
    tables = tables_from_manifest(manifest, 16, constraints={
        "b": TableConstraints(sharding_types=("data_parallel",))})
    assert [(t.name, t.num_embeddings, t.pooling_factor) for t in tables] == [
        ("a", 1000, 2.5), ("b", 30, 1.0)]
    with pytest.raises(ConfigError, match="lacks: c"):
        tables_from_manifest(manifest, 16, constraints={"c": TableConstraints()})


def test_topology_file_round_trip_and_errors(tmp_path: Path) -> None:
    topo = Topology.preset("h200", 16, 8)
    path = topo.save(tmp_path / "topology.json")
    again = Topology.load(path)
    assert again == topo and again.num_hosts == 2
    assert Topology.load(path, world_size=32).local_world_size == 8
    data = json.loads(path.read_text())
    data["hbm_speed"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match="hbm_speed"):
        Topology.load(path)
    with pytest.raises(PlanError, match="do not divide"):
        Topology.preset("cpu", 6, 4)
    with pytest.raises(PlanError, match="unknown device preset"):
        Topology.preset("tpu", 2)
