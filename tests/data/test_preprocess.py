"""preprocess: transforms against hand-computed values, vocabularies, splits, bad rows, atomicity."""

from __future__ import annotations

import functools
import gzip
import math
from pathlib import Path

import polars as pl
import pytest
import yaml

from ctrctl.data.manifest import DatasetManifest
from ctrctl.data.preprocess import preprocess as _preprocess
from ctrctl.data.schema import Schema, load_schema
from ctrctl.errors import (
    ConfigError,
    DatasetError,
    InputDataError,
    OutputExistsError,
    SchemaError,
)
from ctrctl.io import temp_path

#: These tests check exact rows per split: no val is carved unless a test asks for one.
preprocess = functools.partial(_preprocess, val_fraction=0.0)

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ROOT / "schemas" / "criteo.yaml"
AVAZU = ROOT / "schemas" / "avazu.yaml"


def small_schema(**sparse: object) -> Schema:
    """label, d1 (int, log1p), d2 (float, none, fill 1.5), d3 (float, clip 0..2),
    h (hex, hash 7), i (int, hash 5), s (string, hash 11), m (int multi-hot '|', hash 100)."""
    s_spec = {"name": "s", "role": "sparse", "type": "string", "hash_size": 11, **sparse}
    return Schema.from_dict({
        "name": "small", "format": "tsv", "label": "y",
        "columns": [
            {"name": "y", "role": "label"},
            {"name": "d1", "role": "dense", "type": "int"},
            {"name": "d2", "role": "dense", "transform": "none", "fill": 1.5},
            {"name": "d3", "role": "dense", "transform": "clip", "clip": [0, 2]},
            {"name": "skip", "role": "ignore"},
            {"name": "h", "role": "sparse", "type": "hex", "hash_size": 7},
            {"name": "i", "role": "sparse", "type": "int", "hash_size": 5},
            s_spec,
            {"name": "m", "role": "sparse", "type": "int", "hash_size": 100,
             "multi_hot_separator": "|"},
        ],
    })


def write(path: Path, rows: list[list[str]], sep: str = "\t") -> Path:
    path.write_text("".join(sep.join(r) + "\n" for r in rows))
    return path


def read_split(out: Path, split: str) -> pl.DataFrame:
    return pl.read_parquet(sorted((out / split).glob("part-*.parquet")))


def criteo_rows(n: int, seed: int = 0) -> list[list[str]]:
    """Criteo-shaped rows (label, 13 ints, 26 hex) with some empty fields."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        row = [str(int(rng.random() < 0.25))]
        row += ["" if rng.random() < 0.2 else str(rng.randint(-2, 500)) for _ in range(13)]
        row += ["" if rng.random() < 0.1 else f"{rng.randrange(50) * 2654435761 % 2**32:08x}"
                for _ in range(26)]
        rows.append(row)
    return rows


# ---- transforms ------------------------------------------------------------------------
def test_transforms_match_hand_computed_values(tmp_path: Path) -> None:
    rows = [
        ["1", "3", "2.5", "5", "x", "ff", "-3", "abc", "1|2|203"],
        ["0", "-4", "", "-1", "", "", "12", "", ""],
        ["1", "", "-7.25", "1.5", "y", "0a", "", "abc", "7"],
    ]
    src = write(tmp_path / "in.tsv", rows)
    m = preprocess(small_schema(), [str(src)], tmp_path / "out")
    df = read_split(tmp_path / "out", "train")
    assert df.columns == ["y", "d1", "d2", "d3", "h", "i", "s", "m"]
    assert df.schema["y"] == pl.Int8 and df.schema["d1"] == pl.Float32
    assert df.schema["h"] == pl.Int64 and df.schema["m"] == pl.List(pl.Int64)
    assert df["y"].to_list() == [1, 0, 1]
    # d1: log1p of max(x, 0), missing -> 0.
    assert df["d1"].to_list() == pytest.approx([math.log(4), 0.0, 0.0], rel=1e-6)
    # d2: no transform, missing -> fill 1.5.
    assert df["d2"].to_list() == [2.5, 1.5, -7.25]
    # d3: clipped to [0, 2].
    assert df["d3"].to_list() == [2.0, 0.0, 1.5]
    # h: hex value mod 7 (0xff = 255 -> 3, 0x0a = 10 -> 3), missing -> 0.
    assert df["h"].to_list() == [255 % 7, 0, 10 % 7]
    # i: floor modulo keeps negative ints in range: -3 mod 5 = 2.
    assert df["i"].to_list() == [2, 12 % 5, 0]
    # s: a string hash, equal for equal strings, in range.
    s = df["s"].to_list()
    assert s[0] == s[2] and all(0 <= v < 11 for v in s) and s[1] == 0
    # m: multi-hot lists, each element mod 100; a missing field is an empty list.
    assert df["m"].to_list() == [[1, 2, 3], [], [7]]
    assert m.splits["train"].rows == 3 and m.splits["train"].label_rate == pytest.approx(2 / 3)
    d1 = m.dense[0]
    assert d1.name == "d1" and d1.missing_rate == pytest.approx(1 / 3)
    assert d1.max == pytest.approx(math.log(4), rel=1e-6) and d1.min == 0.0
    assert d1.mean == pytest.approx(math.log(4) / 3, rel=1e-6)
    sparse = {f.name: f for f in m.sparse}
    assert sparse["h"].num_embeddings == 7 and sparse["h"].cardinality == 2
    assert sparse["m"].multi_hot and sparse["m"].mean_length == pytest.approx(4 / 3)


def test_empty_trailing_fields_are_missing_and_absent_ones_a_bad_row(tmp_path: Path) -> None:
    src = write(tmp_path / "in.tsv", [["1", "3", "2", "1", "x", "ff", "4", "a", "5"],
                                      ["0", "9", "", "", "", "", "", "", ""]])
    preprocess(small_schema(), [str(src)], tmp_path / "out")
    df = read_split(tmp_path / "out", "train")
    assert df.row(1) == (0, pytest.approx(math.log(10)), 1.5, 0.0, 0, 0, 0, [])
    short = write(tmp_path / "short.tsv", [["1", "3", "2", "1", "x", "ff", "4", "a", "5"],
                                           ["0", "9"]])  # cut short: not missing values
    with pytest.raises(InputDataError, match=r"short\.tsv:2: row has fewer fields"):
        preprocess(small_schema(), [str(short)], tmp_path / "out2")


def test_derived_time_features(tmp_path: Path) -> None:
    schema = Schema.from_dict({
        "name": "t", "format": "csv", "label": "y",
        "columns": [
            {"name": "y", "role": "label"},
            {"name": "hour", "role": "ignore",
             "derive": {"format": "%y%m%d%H", "features": ["hour_of_day", "weekday"]}},
            {"name": "c", "role": "sparse", "type": "int", "hash_size": 10},
        ],
    })
    # 2014-10-21 was a Tuesday (ISO weekday 2), 2014-10-26 a Sunday (7).
    src = write(tmp_path / "in.csv", [["0", "14102100", "1"], ["1", "14102623", "2"]], ",")
    preprocess(schema, [str(src)], tmp_path / "out")
    df = read_split(tmp_path / "out", "train")
    assert df["hour_of_day"].to_list() == [0, 23] and df["weekday"].to_list() == [2, 7]


# ---- vocabulary mode ---------------------------------------------------------------------
def test_vocabulary_threshold_and_oov(tmp_path: Path) -> None:
    schema = Schema.from_dict({
        "name": "v", "format": "csv", "label": "y",
        "columns": [{"name": "y", "role": "label"},
                    {"name": "c", "role": "sparse", "type": "string", "min_count": 2}],
    })
    train = ["a", "b", "a", "c", "b", "a", "", ""]
    val = ["a", "c", "z", "b", ""]
    src_train = write(tmp_path / "train.csv", [["0", v] for v in train], ",")
    src_val = write(tmp_path / "val.csv", [["1", v] for v in val], ",")
    m = preprocess(schema, [f"train={src_train}", f"val={src_val}"], tmp_path / "out")
    vocab = pl.read_parquet(tmp_path / "out" / "vocab" / "c.parquet")
    # counts: a 3, b 2, missing 2, c 1 (< 2: out of vocabulary). Ties by value, nulls last.
    assert vocab.rows() == [("a", 3, 1), ("b", 2, 2), (None, 2, 3)]
    assert read_split(tmp_path / "out", "train")["c"].to_list() == [1, 2, 1, 0, 2, 1, 3, 3]
    # c is rare and z unseen in train: both OOV (0).
    assert read_split(tmp_path / "out", "val")["c"].to_list() == [1, 0, 0, 2, 3]
    feature = m.sparse[0]
    assert (feature.mode, feature.num_embeddings, feature.min_count) == ("vocab", 4, 2)
    assert feature.cardinality == 4


def test_vocabulary_of_multi_hot_feature(tmp_path: Path) -> None:
    schema = Schema.from_dict({
        "name": "v", "format": "csv", "label": "y",
        "columns": [{"name": "y", "role": "label"},
                    {"name": "c", "role": "sparse", "type": "int", "min_count": 2,
                     "multi_hot_separator": "|"}],
    })
    src = write(tmp_path / "t.csv", [["0", "5|6"], ["1", "6|7"], ["0", "6|5"]], ",")
    preprocess(schema, [str(src)], tmp_path / "out")
    # 6 thrice -> 1, 5 twice -> 2, 7 once -> OOV 0.
    assert read_split(tmp_path / "out", "train")["c"].to_list() == [[2, 1], [1, 0], [1, 2]]


def test_reuse_transforms_maps_ids_identically(tmp_path: Path) -> None:
    schema = load_schema(CRITEO).with_vocab(2)
    rows = criteo_rows(400)
    train = write(tmp_path / "train.tsv", rows[:300])
    later = write(tmp_path / "later.tsv", rows[250:])
    first = preprocess(schema, [str(train)], tmp_path / "ds")
    follow = preprocess(None, [f"test={later}"], tmp_path / "next",
                        reuse_transforms=tmp_path / "ds")
    before = read_split(tmp_path / "ds", "train").slice(250)
    after = read_split(tmp_path / "next", "test").head(50)
    assert before.equals(after)
    assert follow.follows is not None
    assert follow.follows["manifest_hash"] == first.content_hash()
    assert follow.table_sizes() == first.table_sizes()
    assert (tmp_path / "next" / "vocab" / "C1.parquet").is_file()
    with pytest.raises(ConfigError, match="differs"):
        preprocess(CRITEO, [f"test={later}"], tmp_path / "x", reuse_transforms=tmp_path / "ds")


def test_reusing_transforms_still_carves_a_val_split(tmp_path: Path) -> None:
    # A later day of a schedule follows day 1's vocabularies and needs its own val split
    # (early stopping); ids stay day 1's.
    schema = load_schema(CRITEO).with_vocab(2)
    rows = criteo_rows(400)
    preprocess(schema, [str(write(tmp_path / "day1.tsv", rows[:200]))], tmp_path / "ds")
    later = _preprocess(None, [str(write(tmp_path / "day2.tsv", rows[200:]))],
                        tmp_path / "next", reuse_transforms=tmp_path / "ds", val_fraction=0.1)
    val, train = later.splits["val"].rows, later.splits["train"].rows
    assert val + train == 200 and 5 <= val <= 40  # each row to val with probability 0.1
    assert later.transforms["val_carved"]["fraction"] == 0.1
    assert later.table_sizes() == DatasetManifest.load(tmp_path / "ds").table_sizes()


# ---- splits and determinism ---------------------------------------------------------------
def test_random_split_is_deterministic_and_partitions_rows(tmp_path: Path) -> None:
    src = write(tmp_path / "in.tsv", criteo_rows(2000))
    a = preprocess(CRITEO, [str(src)], tmp_path / "a", split_ratio="0.8,0.1,0.1", seed=7)
    b = preprocess(CRITEO, [str(src)], tmp_path / "b", split_ratio="0.8,0.1,0.1", seed=7)
    assert b.splits == a.splits
    c = preprocess(CRITEO, [str(src)], tmp_path / "c", split_ratio="0.8,0.1,0.1", seed=8)
    rows = {k: v.rows for k, v in a.splits.items()}
    assert sum(rows.values()) == 2000
    assert 1500 < rows["train"] < 1700 and 120 < rows["val"] < 280
    for info in a.splits.values():
        for rel in info.files:
            assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    assert {k: v.rows for k, v in c.splits.items()} != rows
    every = pl.concat([read_split(tmp_path / "a", s) for s in ("train", "val", "test")])
    whole = preprocess(CRITEO, [str(src)], tmp_path / "whole")
    assert whole.splits["train"].rows == 2000
    assert every.sort(every.columns).equals(
        read_split(tmp_path / "whole", "train").sort(every.columns))


def test_named_splits_several_paths_and_gzip(tmp_path: Path) -> None:
    rows = criteo_rows(300)
    a = write(tmp_path / "a.tsv", rows[:100])
    b = write(tmp_path / "b.tsv", rows[100:200])
    gz = tmp_path / "c.tsv.gz"
    with gzip.open(gz, "wt") as handle:
        handle.write("".join("\t".join(r) + "\n" for r in rows[200:]))
    m = preprocess(CRITEO, [f"train={a}", f"train={b}", f"test={gz}"], tmp_path / "out")
    assert m.splits["train"].files == ("train/part-00000.parquet", "train/part-00001.parquet")
    assert m.splits["test"].rows == 100 and "val" not in m.splits
    plain = write(tmp_path / "c.tsv", rows[200:])
    preprocess(CRITEO, [f"test={plain}"], tmp_path / "plain")
    assert read_split(tmp_path / "out", "test").equals(read_split(tmp_path / "plain", "test"))
    assert [i["split"] for i in m.inputs] == ["train", "train", "test"]
    assert all(len(i["sha256"]) == 64 and i["bytes"] > 0 for i in m.inputs)


def test_split_by_day_halves_the_last_day(tmp_path: Path) -> None:
    rows = criteo_rows(90)
    days = [write(tmp_path / f"day_{d}", rows[30 * d : 30 * d + 30]) for d in range(3)]
    m = preprocess(CRITEO, [str(p) for p in days], tmp_path / "out", split_by_day=True)
    assert {k: v.rows for k, v in m.splits.items()} == {"train": 60, "val": 15, "test": 15}
    whole = preprocess(CRITEO, [str(days[2])], tmp_path / "day2")
    last = read_split(tmp_path / "day2", "train")
    assert read_split(tmp_path / "out", "val").equals(last.head(15))
    assert read_split(tmp_path / "out", "test").equals(last.tail(15))
    assert whole.splits["train"].rows == 30


def test_parquet_input_matches_tsv(tmp_path: Path) -> None:
    rows = criteo_rows(50)
    tsv = write(tmp_path / "in.tsv", rows)
    schema = load_schema(CRITEO)
    names = [c.name for c in schema.columns]
    frame = pl.DataFrame([[r[i] or None for r in rows] for i in range(40)], schema=names,
                         orient="col")
    frame.write_parquet(tmp_path / "in.parquet")
    as_parquet = Schema.from_dict({**schema.to_dict(), "format": "parquet"})
    preprocess(schema, [str(tsv)], tmp_path / "a")
    preprocess(as_parquet, [str(tmp_path / "in.parquet")], tmp_path / "b")
    assert read_split(tmp_path / "a", "train").equals(read_split(tmp_path / "b", "train"))


# ---- bad input ---------------------------------------------------------------------------
GOOD = ["1", "3", "2.5", "1", "x", "ff", "4", "a", "5"]


@pytest.mark.parametrize(
    ("reason", "field", "value", "where", "message"),
    [
        ("too_many_fields", None, None, ":3:10", "more fields"),
        ("bad_label", 0, "2", ":3:1", "label is not 0 or 1"),
        ("bad_label", 0, "", ":3:1", "label is not 0 or 1"),
        ("bad_dense", 1, "1.5", ":3:2", "not an integer"),
        ("bad_dense", 2, "abc", ":3:3", "not a number"),
        ("bad_sparse", 5, "zz", ":3:6", "not a valid hex id"),
        ("bad_sparse", 6, "4x", ":3:7", "not a valid int id"),
        ("bad_sparse", 8, "1|q", ":3:9", "not a valid int id"),
    ],
)
def test_bad_rows_error_and_skip(tmp_path: Path, reason: str, field: int | None,
                                 value: str | None, where: str, message: str) -> None:
    bad = list(GOOD) + ["extra"] if field is None else list(GOOD)
    if field is not None:
        bad[field] = value  # type: ignore[call-overload]
    negative = ["0", *GOOD[1:]]  # both classes survive the skip
    src = write(tmp_path / "in.tsv", [GOOD, negative, bad, GOOD])
    with pytest.raises(InputDataError, match=message) as info:
        preprocess(small_schema(), [str(src)], tmp_path / "out")
    assert info.value.where == f"{src}{where}"
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in.tsv"]
    m = preprocess(small_schema(), [str(src)], tmp_path / "out", on_bad_rows="skip")
    assert m.splits["train"].rows == 3
    assert m.bad_rows == {r: int(r == reason) for r in m.bad_rows}
    assert m.inputs[0]["bad_rows"][reason] == 1


def test_bad_row_line_numbers_count_the_header(tmp_path: Path) -> None:
    schema = load_schema(AVAZU)
    names = [c.name for c in schema.columns]
    good = ["1", "0", "14102100", "1005", "0"] + ["1fbe01fe"] * 9 + ["1"] * 10
    bad = list(good)
    bad[names.index("site_id")] = "nothex!"
    src = write(tmp_path / "in.csv", [names, good, good, bad], ",")
    with pytest.raises(InputDataError) as info:
        preprocess(schema, [str(src)], tmp_path / "out")
    assert info.value.where == f"{src}:4:{names.index('site_id') + 1}"


def test_input_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(InputDataError, match="empty"):
        preprocess(CRITEO, [str(empty)], tmp_path / "out")
    with pytest.raises(InputDataError, match="not found"):
        preprocess(CRITEO, [str(tmp_path / "absent.tsv")], tmp_path / "out")
    blank = write(tmp_path / "blank.tsv", [[""]])
    with pytest.raises(InputDataError, match="no data rows"):
        preprocess(CRITEO, [str(blank)], tmp_path / "out")
    with pytest.raises(ConfigError, match="split-ratio"):
        preprocess(CRITEO, [str(empty)], tmp_path / "out", split_ratio="0.5,0.1")
    assert not (tmp_path / "out").exists()


def test_schema_that_does_not_match_the_file(tmp_path: Path) -> None:
    avazu_like = write(tmp_path / "a.csv", [["1", "0", "14102100"] + ["5"] * 21], ",")
    with pytest.raises(SchemaError, match="fields"):
        preprocess(CRITEO, [str(avazu_like)], tmp_path / "out")
    header = write(tmp_path / "h.csv", [["id", "click", "when"], ["1", "0", "x"]], ",")
    with pytest.raises(SchemaError, match="header does not match"):
        preprocess(AVAZU, [str(header)], tmp_path / "out")
    wide = write(tmp_path / "w.tsv", [["0"] * 41])
    with pytest.raises(SchemaError, match="41 fields"):
        preprocess(CRITEO, [str(wide)], tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "h.csv", "w.tsv"]


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    src = write(tmp_path / "in.tsv", criteo_rows(20))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(OutputExistsError):
        preprocess(CRITEO, [str(src)], out)
    assert (out / "keep").exists()
    m = preprocess(CRITEO, [str(src)], out, overwrite=True)
    assert not (out / "keep").exists() and m.splits["train"].rows == 20
    assert DatasetManifest.load(out).splits["train"].rows == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tsv", "out"]


def test_stale_temp_folder_is_removed_and_never_output(tmp_path: Path) -> None:
    src = write(tmp_path / "in.tsv", criteo_rows(20))
    # A temp folder of a killed run: its pid no longer exists.
    dead = 2**22 + 12345
    assert not Path(f"/proc/{dead}").exists()
    stale = temp_path(tmp_path / "out", pid=dead)
    (stale / "train").mkdir(parents=True)
    mine = temp_path(tmp_path / "out")  # a live run's folder is left alone
    mine.mkdir()
    with pytest.raises(DatasetError):
        DatasetManifest.load(tmp_path / "out")
    preprocess(CRITEO, [str(src)], tmp_path / "out")
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [mine.name, "in.tsv", "out"]


# ---- the real samples ----------------------------------------------------------------------
def test_criteo_kaggle_sample(tmp_path: Path, criteo_8k: Path) -> None:
    m = preprocess(CRITEO, [f"train={criteo_8k / 'train.csv'}", f"val={criteo_8k / 'dev.csv'}",
                            f"test={criteo_8k / 'test.csv'}"], tmp_path / "ds")
    assert {k: v.rows for k, v in m.splits.items()} == {"train": 7200, "val": 409, "test": 391}
    assert m.splits["train"].label_rate == pytest.approx(0.215, abs=0.002)
    assert sum(m.bad_rows.values()) == 0
    df = read_split(tmp_path / "ds", "train")
    for feature in m.sparse:
        assert 0 <= df[feature.name].min() and df[feature.name].max() < feature.num_embeddings
        assert 1 <= feature.cardinality <= 7200
    assert all(f.min >= 0 and f.max < 20 for f in m.dense)
    assert DatasetManifest.load(tmp_path / "ds").content_hash() == m.content_hash()


def test_avazu_sample_with_and_without_header(tmp_path: Path, avazu_9k: Path) -> None:
    m = preprocess(AVAZU, [f"train={avazu_9k / 'train.csv'}", f"val={avazu_9k / 'dev.csv'}",
                           f"test={avazu_9k / 'test.csv'}"], tmp_path / "ds")
    assert {k: v.rows for k, v in m.splits.items()} == {"train": 8087, "val": 480, "test": 432}
    assert m.sparse_names[-2:] == ["hour_of_day", "weekday"] and not m.dense
    df = read_split(tmp_path / "ds", "val")
    assert df.columns[0] == "click" and df["hour_of_day"].max() < 24
    assert 0.1 < m.splits["train"].label_rate < 0.3


def test_manifest_round_trips(tmp_path: Path) -> None:
    src = write(tmp_path / "in.tsv", criteo_rows(30))
    m = preprocess(CRITEO, [str(src)], tmp_path / "out")
    loaded = DatasetManifest.load(tmp_path / "out")
    assert loaded.schema_hash == load_schema(CRITEO).content_hash()
    assert loaded.table_sizes() == m.table_sizes()
    assert loaded.transforms["dense"]["I1"]["transform"] == "log1p"
    assert yaml.safe_dump(loaded.schema)  # the schema is stored in full


# ---- memory ---------------------------------------------------------------------------------
def _peak_rss_mb(src: Path, out: Path) -> float:
    """Preprocess ``src`` in a child process; the child's own peak RSS (VmHWM) in MiB.

    (A child's rusage would also count the parent's pages at fork time.)
    """
    import subprocess
    import sys

    code = ("import sys, pathlib; from ctrctl.data.preprocess import preprocess; "
            "preprocess(sys.argv[1], [sys.argv[2]], sys.argv[3]); "
            "print(next(l for l in pathlib.Path('/proc/self/status').read_text().splitlines() "
            "if l.startswith('VmHWM')).split()[1])")
    result = subprocess.run([sys.executable, "-c", code, str(CRITEO), str(src), str(out)],
                            capture_output=True, text=True, check=True)
    return int(result.stdout.split()[-1]) / 1024


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_input(tmp_path: Path) -> None:
    block = "".join("\t".join(r) + "\n" for r in criteo_rows(10_000))
    small, large = tmp_path / "small.tsv", tmp_path / "large.tsv"
    small.write_text(block * 25)  # 250,000 rows
    with large.open("w") as handle:  # 2,500,000 rows, ~600 MB
        for _ in range(250):
            handle.write(block)
    small_mb = _peak_rss_mb(small, tmp_path / "a")
    large_mb = _peak_rss_mb(large, tmp_path / "b")
    splits = DatasetManifest.load(tmp_path / "b").splits
    assert sum(split.rows for split in splits.values()) == 2_500_000
    assert large_mb <= 1.5 * small_mb, (small_mb, large_mb)
