"""Managed-collision features: the schema's ``collision:`` entry and raw keys from preprocess."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest

from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema
from ctrctl.data.transforms import stable_key
from ctrctl.errors import SchemaError


def schema_dict(collision: dict[str, Any], time_column: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "zch", "format": "csv", "header": True, "label": "click",
        "columns": [
            {"name": "click", "role": "label"},
            {"name": "day", "role": "ignore"},
            {"name": "user", "role": "sparse", "type": "string", "collision": collision},
            {"name": "item", "role": "sparse", "type": "int",
             "collision": {"kind": "zch", "capacity": 4}},
            {"name": "site", "role": "sparse", "type": "hex",
             "collision": {"kind": "zch", "capacity": 4, "eviction": "lru"}},
            {"name": "ad", "role": "sparse", "type": "int", "hash_size": 5},
        ],
    }
    if time_column:
        data["time_column"] = time_column
    return data


@pytest.mark.parametrize(("collision", "time_column", "message"), [
    ({"kind": "zch", "capacity": 0}, None, "capacity >= 2"),
    ({"kind": "zch", "capacity": 10, "eviction": "fifo"}, None, "'lfu', 'lru' or 'ttl'"),
    ({"kind": "zch", "capacity": 10, "eviction": "ttl", "ttl_days": 3}, None, "time_column"),
    ({"kind": "zch", "capacity": 10, "eviction": "ttl"}, "day", "ttl_days > 0"),
    ({"kind": "zch", "capacity": 10, "admit_min_count": 0}, None, "admit_min_count"),
    ({"kind": "mch", "capacity": 10}, None, "'zch'"),
    ({"kind": "zch", "capacity": 10, "shards": 10}, None, "1 <= shards <= capacity - 1"),
])
def test_bad_collision_entries_are_one_clear_error(collision: dict[str, Any],
                                                   time_column: str | None, message: str) -> None:
    with pytest.raises(SchemaError, match=message) as info:
        Schema.from_dict(schema_dict(collision, time_column), where="zch.yaml")
    assert "zch.yaml" in str(info.value)


def test_a_collision_entry_excludes_hash_size() -> None:
    data = schema_dict({"kind": "zch", "capacity": 10})
    data["columns"][2]["hash_size"] = 100
    with pytest.raises(SchemaError, match="exactly one of hash_size"):
        Schema.from_dict(data)


def test_ttl_with_a_time_column_loads() -> None:
    schema = Schema.from_dict(schema_dict(
        {"kind": "zch", "capacity": 10, "eviction": "ttl", "ttl_days": 3}, "day"))
    assert schema.sparse[0].mode == "zch"
    assert schema.time_column == "day"


def test_preprocess_writes_raw_keys_without_modulo(tmp_path: Path) -> None:
    rows = [("1", "1", "alice", "123456789012", "ffffffffffffffff", "7"),
            ("0", "1", "bob", "-5", "0a", "8"),
            ("1", "2", "", "3", "7fffffffffffffff", "9")]
    raw = tmp_path / "logs.csv"
    raw.write_text("click,day,user,item,site,ad\n" + "".join(",".join(r) + "\n" for r in rows))
    schema = Schema.from_dict(schema_dict({"kind": "zch", "capacity": 10, "eviction": "lru"}))
    manifest = preprocess(schema, [f"train={raw}"], tmp_path / "ds", val_fraction=0.0)
    frame = pl.read_parquet(tmp_path / "ds" / manifest.split("train").files[0])
    assert frame["user"].to_list() == [stable_key("alice"), stable_key("bob"), 0]
    assert frame["item"].to_list() == [123456789012, -5, 3]
    assert frame["site"].to_list() == [-1, 10, 2**63 - 1]  # the 64 bits, read as signed
    assert frame["ad"].to_list() == [2, 3, 4]  # hashed features unchanged
    features = {f.name: f for f in manifest.sparse}
    assert (features["user"].mode, features["user"].num_embeddings) == ("zch", 10)
    assert features["user"].collision == {"kind": "zch", "capacity": 10, "eviction": "lru",
                                          "admit_min_count": 1, "shards": 1}
    assert features["ad"].mode == "hash" and features["ad"].collision is None


def test_stable_key_is_fixed() -> None:
    """The key of a string is pinned: serving and the standalone loader recompute it."""
    assert stable_key("alice") == stable_key("alice") != stable_key("alice ")
    assert stable_key("alice") == -8_513_398_901_633_652_147
    assert stable_key("") == -5_426_141_060_434_712_860
