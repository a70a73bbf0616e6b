"""Interaction logs: role: query/item/item_id, positives only, leave-last-out per user."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest

from ctrctl.data.manifest import DatasetManifest
from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema, load_schema
from ctrctl.errors import SchemaError
from tests.conftest import shared_data

ROOT = Path(__file__).resolve().parents[2]


def reference_split(rows: list[tuple[int, int, float, int]],
                    threshold: float | None) -> dict[str, list[tuple[int, int]]]:
    """Leave-last-out in plain Python: (user, item) pairs per split, file order kept."""
    kept = [(i, r) for i, r in enumerate(rows) if threshold is None or r[2] >= threshold]
    by_user: dict[int, list[tuple[int, tuple[int, int, float, int]]]] = {}
    for index, row in kept:
        by_user.setdefault(row[0], []).append((index, row))
    split_of: dict[int, str] = {}
    for entries in by_user.values():
        ordered = sorted(entries, key=lambda e: (e[1][3], e[0]))  # time, then file order
        for position, (index, _) in enumerate(reversed(ordered)):
            split_of[index] = "test" if position == 0 else "val" if position == 1 else "train"
    out: dict[str, list[tuple[int, int]]] = {"train": [], "val": [], "test": []}
    for index, row in kept:
        out[split_of[index]].append((row[0], row[1]))
    return out


def read_pairs(folder: Path, manifest: DatasetManifest, split: str,
               user: str = "user", item: str = "item") -> list[tuple[int, int]]:
    if split not in manifest.splits:
        return []
    frame = pl.concat([pl.read_parquet(folder / f) for f in manifest.splits[split].files])
    return list(zip(frame[user].to_list(), frame[item].to_list(), strict=True))


def test_roles_become_sparse_features_of_a_tower() -> None:
    schema = load_schema(ROOT / "schemas" / "movielens_retrieval.yaml")
    assert [c.role for c in schema.sparse] == ["sparse", "sparse"]
    assert schema.towers() == {"query": ["user"], "item": ["item"]}
    assert Schema.from_dict(schema.to_dict()) == schema  # round-trips through the manifest


def test_an_interactions_schema_needs_one_item_id() -> None:
    data = load_schema(ROOT / "schemas" / "movielens_retrieval.yaml").to_dict()
    data["columns"][1] = {**data["columns"][1], "tower": "item"}
    with pytest.raises(SchemaError, match="item_id"):
        Schema.from_dict(data)


@pytest.mark.parametrize("positives", ["label", "all"])
def test_leave_last_out_matches_a_pure_python_reference(tmp_path: Path, positives: str) -> None:
    rng = random.Random(7)
    # few distinct times, so that ties (kept in file order) occur
    rows = [(rng.randint(1, 30), rng.randint(1, 50), float(rng.randint(1, 5)), rng.randint(0, 20))
            for _ in range(600)]
    path = tmp_path / "u.data"
    path.write_text("".join(f"{u}\t{i}\t{r:g}\t{t}\n" for u, i, r, t in rows))
    data = load_schema(ROOT / "schemas" / "movielens_retrieval.yaml").to_dict()
    data["interactions"]["positives"] = positives
    manifest = preprocess(Schema.from_dict(data), [str(path)], tmp_path / "ds")
    expected = reference_split(rows, 4.0 if positives == "label" else None)
    for split in ("train", "val", "test"):
        assert read_pairs(tmp_path / "ds", manifest, split) == expected[split], split
    assert "val_carved" not in manifest.transforms


def test_split_ratio_still_divides_the_positives_at_random(tmp_path: Path) -> None:
    path = tmp_path / "ratings.csv"
    lines = ["userId,movieId,rating,timestamp"]
    lines += [f"{u},{m},{r},{t}" for u, m, r, t in
              [(u, 100 + i, 3.5 + (i % 4) * 0.5, i) for u in range(1, 41) for i in range(10)]]
    path.write_text("\n".join(lines) + "\n")
    schema = load_schema(ROOT / "schemas" / "movielens_latest_retrieval.yaml")
    manifest = preprocess(schema, [str(path)], tmp_path / "ds", split_ratio="0.8,0.1,0.1",
                          val_fraction=0.0)
    total = sum(s.rows for s in manifest.splits.values())
    assert total == 40 * 7  # ratings 4.0, 4.5 and 5.0 of each user's 3.5 .. 5.0 cycle
    assert manifest.splits["train"].rows > manifest.splits["test"].rows


def test_movielens_100k_leave_last_out(tmp_path: Path) -> None:
    data = shared_data("movielens-100k")
    manifest = preprocess(ROOT / "schemas" / "movielens_retrieval.yaml",
                          [str(data / "u.data")], tmp_path / "ds")
    rows = {k: v.rows for k, v in manifest.splits.items()}
    assert sum(rows.values()) == 55_375  # ratings >= 4
    users = len({u for u, _ in read_pairs(tmp_path / "ds", manifest, "test")})
    assert rows["test"] == users and rows["val"] <= users
