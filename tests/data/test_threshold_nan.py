"""Under a threshold label map, nan and inf are bad rows, not clicks (nan compared above
every threshold and became a 1, with nothing counted)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema
from ctrctl.errors import InputDataError

SCHEMA = Schema.from_dict({
    "name": "ratings", "format": "tsv", "label": {"threshold": 4.0},
    "columns": [{"name": "user", "role": "sparse", "type": "int", "hash_size": 100},
                {"name": "item", "role": "sparse", "type": "int", "hash_size": 100},
                {"name": "rating", "role": "label"}, {"name": "time", "role": "ignore"}]})


def _ratings(path: Path, ratings: list[str]) -> Path:
    path.write_text("".join(f"{i}\t{i + 1}\t{r}\t0\n" for i, r in enumerate(ratings)))
    return path


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf"])
def test_a_non_finite_rating_is_a_bad_row(value: str, tmp_path: Path) -> None:
    src = _ratings(tmp_path / "u.data", ["5", "1", value])
    with pytest.raises(InputDataError, match=r"u\.data:3:3: .*finite number"):
        preprocess(SCHEMA, [f"train={src}"], tmp_path / "ds", val_fraction=0.0)
    assert not (tmp_path / "ds").exists()


def test_skipped_non_finite_ratings_are_counted(tmp_path: Path) -> None:
    ratings = ["5", "1", "4", "nan", *["2"] * 40, "inf", "-1", "4.5"]
    src = _ratings(tmp_path / "u.data", ratings)
    m = preprocess(SCHEMA, [f"train={src}"], tmp_path / "ds", val_fraction=0.0,
                   on_bad_rows="skip", max_skip_fraction=0.1)
    assert m.splits["train"].rows == len(ratings) - 2
    assert sum(m.bad_rows.values()) == 2
    labels = pq.read_table(next((tmp_path / "ds" / "train").glob("*.parquet")))
    assert labels.column("rating").to_pylist() == [1, 0, 1, *[0] * 40, 0, 1]  # -1 is a 0
