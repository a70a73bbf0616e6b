"""Labels mapped to 0/1 (map, threshold), the libfm reader, named splits, a val split carved
from train, and --on-bad-rows skip refusing to drop a whole class or too many rows."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import polars as pl
import pytest

from ctrctl.data.dataset import BatchLoader
from ctrctl.data.preprocess import preprocess as _preprocess
from ctrctl.data.readers import parse_input
from ctrctl.data.schema import Schema, load_schema
from ctrctl.errors import InputDataError, SchemaError

#: These tests check exact rows per split: no val is carved unless a test asks for one.
preprocess = functools.partial(_preprocess, val_fraction=0.0)

ROOT = Path(__file__).resolve().parents[2]
FRAPPE = ROOT / "schemas" / "frappe.yaml"


def _libfm_rows(n: int, seed: int = 0) -> list[str]:
    """Frappe-shaped synthetic lines: label -1/1 and 10 one-hot fields at offsets."""
    rng = random.Random(seed)
    offsets = [0, 1000, 5000, 5010, 5020, 5030, 5040, 5050, 5060, 5100]
    lines = []
    for _ in range(n):
        label = rng.choice(["-1", "-1", "1"])
        fields = [f"{off + rng.randrange(8)}:1" for off in offsets]
        lines.append(" ".join([label, *fields]))
    return lines


def _write(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.write_bytes((newline.join(lines) + newline).encode())
    return path


def _split(out: Path, split: str) -> pl.DataFrame:
    return pl.read_parquet(out / split / "*.parquet")


def test_label_rules_are_validated() -> None:
    base = {"name": "x", "columns": [{"name": "y", "role": "label"},
                                     {"name": "a", "role": "sparse", "hash_size": 10}]}
    schema = Schema.from_dict({**base, "label": {"map": {-1: 0, 1: 1}}})
    assert schema.label == "y" and schema.label_rule is not None
    assert schema.label_rule.map == {"-1": 0, "1": 1}
    assert Schema.from_dict(schema.to_dict()) == schema  # the manifest's copy reads back
    assert Schema.from_dict({**base, "label": {"threshold": 4}}).label_rule.threshold == 4.0  # type: ignore[union-attr]
    for bad, message in (({"map": {1: 2}}, "0 or 1"), ({"map": {}}, "empty"),
                         ({"map": {1: 1}, "threshold": 1.0}, "exactly one"),
                         ({"threshold": 1.0, "name": "nope"}, "label")):
        with pytest.raises(SchemaError, match=message):
            Schema.from_dict({**base, "label": bad})


def test_frappe_schema_reads_libfm_and_maps_minus_one(tmp_path: Path) -> None:
    lines = _libfm_rows(400)
    src = _write(tmp_path / "a.libfm", lines, newline="\r\n")  # Frappe's files end in CRLF
    test = _write(tmp_path / "b.libfm", _libfm_rows(100, seed=1))
    m = preprocess(FRAPPE, [f"train={src}", f"test={test}"], tmp_path / "ds",
                   val_fraction=0.0)
    assert m.splits["train"].rows == 400 and m.splits["test"].rows == 100
    frame = _split(tmp_path / "ds", "train")
    expected = [1 if line.split(" ")[0] == "1" else 0 for line in lines]
    assert frame["label"].to_list() == expected
    assert m.splits["train"].label_rate == pytest.approx(sum(expected) / 400)
    # each field's index went through the vocabulary: 8 values per field + OOV row 0
    assert m.table_sizes()["user"] == 9
    assert frame["user"].min() >= 1  # every value was seen enough times


def test_threshold_labels_from_ratings(tmp_path: Path) -> None:
    schema = Schema.from_dict({
        "name": "ratings", "format": "tsv", "label": {"threshold": 4.0},
        "columns": [{"name": "user", "role": "sparse", "type": "int", "hash_size": 100},
                    {"name": "item", "role": "sparse", "type": "int", "hash_size": 100},
                    {"name": "rating", "role": "label"}, {"name": "time", "role": "ignore"}]})
    ratings = ["1", "5", "3", "4", "2", "4.5"]
    src = _write(tmp_path / "u.data", [f"{i}\t{i + 1}\t{r}\t0" for i, r in enumerate(ratings)])
    preprocess(schema, [str(src)], tmp_path / "ds")
    assert _split(tmp_path / "ds", "train")["rating"].to_list() == [0, 1, 0, 1, 0, 1]
    bad = _write(tmp_path / "bad.data", ["1\t2\tgood\t0"])
    with pytest.raises(InputDataError, match="label.threshold"):
        preprocess(schema, [str(bad)], tmp_path / "ds2")


@pytest.mark.parametrize("carve", [False, True])  # --split-ratio, or val carved from train
@pytest.mark.parametrize("min_count", [2, None])  # vocabulary mode stages keys first
def test_splits_into_a_relative_output_folder(tmp_path: Path, min_count: int | None,
                                              carve: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # The polars path writes all splits of an input through one partitioned sink; the
    # folder given as `--out ds` (relative) once sent the parts to a path below itself, and
    # vocabulary mode then found no training part (the README's avazu_vocab.yaml line).
    sizes = {"min_count": min_count} if min_count else {"hash_size": 1000}
    schema = Schema.from_dict({
        "name": "ratings", "format": "tsv", "label": {"threshold": 4.0},
        "columns": [{"name": "user", "role": "sparse", "type": "int", **sizes},
                    {"name": "item", "role": "sparse", "type": "int", **sizes},
                    {"name": "rating", "role": "label"}, {"name": "time", "role": "ignore"}]})
    rng = random.Random(0)
    lines = [f"{rng.randrange(30)}\t{rng.randrange(40)}\t{rng.randrange(1, 6)}\t0"
             for _ in range(2000)]
    _write(tmp_path / "u.data", lines)
    monkeypatch.chdir(tmp_path)
    if carve:
        m = preprocess(schema, ["train=u.data"], Path("ds"), val_fraction=0.1)
    else:
        m = preprocess(schema, ["u.data"], Path("ds"), split_ratio="0.8,0.1,0.1")
    splits = ("train", "val") if carve else ("train", "val", "test")
    rows = {split: _split(tmp_path / "ds", split).height for split in splits}
    assert rows == {s: m.splits[s].rows for s in rows} and sum(rows.values()) == 2000
    assert 1400 < rows["train"] < (1900 if carve else 1800)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "u.data"]  # nothing left over


def test_skip_refuses_to_drop_a_whole_class(tmp_path: Path) -> None:
    # libfm's -1/1 without a mapping: every negative is a malformed label
    schema = load_schema(FRAPPE).model_copy(update={"label_rule": None})
    src = _write(tmp_path / "a.libfm", _libfm_rows(300))
    with pytest.raises(InputDataError, match="not 0 or 1"):
        preprocess(schema, [str(src)], tmp_path / "ds")
    with pytest.raises(InputDataError) as info:
        preprocess(schema, [str(src)], tmp_path / "ds", on_bad_rows="skip")
    text = str(info.value)
    negatives = sum(line.startswith("-1") for line in _libfm_rows(300))
    assert f"drop {negatives:,} of 300 rows (bad_label {negatives:,})" in text
    assert "whole class" in text and "map" in text
    assert not (tmp_path / "ds").exists()


def test_skip_refuses_to_drop_more_than_the_allowed_share(tmp_path: Path) -> None:
    lines = _libfm_rows(200)
    lines[:20] = [line.replace(":1", "", 1) for line in lines[:20]]  # 10% malformed
    src = _write(tmp_path / "a.libfm", lines)
    with pytest.raises(InputDataError, match=r"10\.0%, more than the 5% allowed"):
        preprocess(FRAPPE, [str(src)], tmp_path / "ds", on_bad_rows="skip",
                   max_skip_fraction=0.05)
    m = preprocess(FRAPPE, [str(src)], tmp_path / "ds", on_bad_rows="skip",
                   max_skip_fraction=0.2)
    assert m.splits["train"].rows == 180 and m.bad_rows["bad_sparse"] == 20


def test_named_splits_and_a_carved_val_split(tmp_path: Path) -> None:
    assert parse_input("holdout=x.tsv").split == "holdout"
    with pytest.raises(InputDataError, match="split name"):
        parse_input("9bad=x.tsv")
    train = _write(tmp_path / "t.libfm", _libfm_rows(1000))
    hold = _write(tmp_path / "h.libfm", _libfm_rows(50, seed=2))
    hold2 = _write(tmp_path / "h2.libfm", _libfm_rows(30, seed=3))
    args = [f"train={train}", f"holdout={hold}", f"holdout={hold2}"]
    m = preprocess(FRAPPE, args, tmp_path / "ds", val_fraction=0.2, seed=5)
    assert list(m.splits) == ["train", "val", "holdout"]
    assert m.splits["holdout"].rows == 80 and len(m.splits["holdout"].files) == 2
    assert m.splits["train"].rows + m.splits["val"].rows == 1000
    assert 120 < m.splits["val"].rows < 280
    assert m.transforms["val_carved"] == {"from": "train", "fraction": 0.2, "seed": 5}
    loader = BatchLoader.for_scoring(tmp_path / "ds", "holdout", 64)
    assert sum(int(b.labels.shape[0]) for b in loader) == 80
    # the same seed draws the same rows; another seed others
    again = preprocess(FRAPPE, args, tmp_path / "ds2", val_fraction=0.2, seed=5)
    other = preprocess(FRAPPE, args, tmp_path / "ds3", val_fraction=0.2, seed=6)
    assert _split(tmp_path / "ds2", "val").equals(_split(tmp_path / "ds", "val"))
    assert again.splits["val"].rows == m.splits["val"].rows
    assert not _split(tmp_path / "ds3", "val").equals(_split(tmp_path / "ds", "val")) or \
        other.splits["val"].rows != m.splits["val"].rows
    # an explicit val input, or val_fraction=0, carves nothing
    named = preprocess(FRAPPE, [f"train={train}", f"val={hold}"], tmp_path / "ds4",
                       val_fraction=0.2)
    assert named.splits["train"].rows == 1000 and "val_carved" not in named.transforms


def test_carved_val_split_on_the_native_fast_path(tmp_path: Path) -> None:
    # Criteo TSV in hash mode takes the native parser (when built); it carves the same rows
    # as the polars path.
    import os

    from tests.data.test_preprocess import CRITEO, criteo_rows, write

    src = write(tmp_path / "c.tsv", criteo_rows(2000))
    fast = preprocess(CRITEO, [str(src)], tmp_path / "fast", val_fraction=0.1, seed=3)
    os.environ["CTRCTL_PREPROCESS_ENGINE"] = "polars"
    try:
        slow = preprocess(CRITEO, [str(src)], tmp_path / "slow", val_fraction=0.1, seed=3)
    finally:
        del os.environ["CTRCTL_PREPROCESS_ENGINE"]
    assert fast.splits["val"].rows == slow.splits["val"].rows > 0
    for split in ("train", "val"):
        assert _split(tmp_path / "fast", split).equals(_split(tmp_path / "slow", split))
