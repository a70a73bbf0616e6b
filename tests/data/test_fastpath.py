"""The native fast path of preprocess writes what the polars path writes, or steps aside."""

from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ctrctl.data import fastpath
from ctrctl.data import preprocess as preprocess_module
from ctrctl.data.preprocess import preprocess as _preprocess
from ctrctl.data.schema import Schema, load_schema
from ctrctl.data.transforms import random_unit, sparse_kinds
from ctrctl.errors import InputDataError
from ctrctl.progress import Progress

from .test_preprocess import CRITEO, criteo_rows, read_split, small_schema, write

#: These tests check exact rows per split: no val is carved unless a test asks for one.
preprocess = functools.partial(_preprocess, val_fraction=0.0)

needs_native = pytest.mark.skipif(fastpath._fastparse is None,
                                  reason="the native parser was not built (no C compiler)")


def test_native_parser_is_built_where_a_compiler_exists() -> None:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None or subprocess.run([compiler, "--version"],
                                          capture_output=True).returncode != 0:
        # (`make test-nocc` installs and tests with CC=/bin/false)
        pytest.skip("no C compiler here: preprocess runs on polars alone")
    assert fastpath._fastparse is not None, "run `make setup` (pip install -e .) to build it"


def run_both(tmp_path: Path, schema: Schema | Path, inputs: list[str],
             monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> tuple[Path, Path]:
    """Preprocess with the fast path and with polars alone; the two output folders."""
    fast, slow = tmp_path / "fast", tmp_path / "polars"
    taken: list[bool] = []
    real = preprocess_module.stream_fast

    def spy(*args: object, **kw: object) -> object:
        result = real(*args, **kw)  # type: ignore[arg-type]
        taken.append(result is not None)
        return result

    monkeypatch.setattr(preprocess_module, "stream_fast", spy)
    preprocess(schema, inputs, fast, **kwargs)  # type: ignore[arg-type]
    monkeypatch.setattr(preprocess_module, "stream_fast", real)
    if kwargs.get("on_bad_rows") is None:
        assert taken and all(taken), "the fast path did not run"
    monkeypatch.setenv(fastpath.ENGINE_ENV, "polars")
    preprocess(schema, inputs, slow, **kwargs)  # type: ignore[arg-type]
    monkeypatch.delenv(fastpath.ENGINE_ENV)
    return fast, slow


def assert_same_dataset(a: Path, b: Path) -> None:
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    ma.pop("created")
    mb.pop("created")
    assert ma == mb
    for split in ma["splits"]:
        fa, fb = read_split(a, split), read_split(b, split)
        assert fa.schema == fb.schema
        assert fa.equals(fb), split


def criteo_text(rows: list[list[str]]) -> str:
    return "".join("\t".join(r) + "\n" for r in rows)


@needs_native
def test_criteo_matches_polars_path_with_three_random_splits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = criteo_rows(3000, seed=1)
    rows[5] = rows[5][:20] + [""] * 20  # empty trailing fields (a row without them is cut short)
    rows[9][3] = "-17"      # negative counts clip to 0 before log1p
    rows[11][2] = "123456789012"  # beyond the log1p table
    src = tmp_path / "in.tsv"
    src.write_text(criteo_text(rows))
    # Small blocks and row groups: many blocks, row groups spanning blocks, a ragged end.
    monkeypatch.setattr(fastpath, "BLOCK_BYTES", 4096)
    fast, slow = run_both(tmp_path, CRITEO, [str(src)], monkeypatch, split_ratio="0.7,0.2,0.1",
                          seed=3, row_group_size=500)
    assert_same_dataset(fast, slow)
    groups = pl.scan_parquet(fast / "train" / "part-00000.parquet")
    assert groups.select(pl.len()).collect().item() > 1500


@needs_native
def test_gzip_crlf_and_missing_final_newline_match(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    text = criteo_text(criteo_rows(400, seed=2)).replace("\n", "\r\n").rstrip("\r\n")
    src = tmp_path / "day_0.gz"
    src.write_bytes(gzip.compress(text.encode()))
    fast, slow = run_both(tmp_path, CRITEO, [f"val={src}"], monkeypatch)
    assert_same_dataset(fast, slow)
    assert json.loads((fast / "manifest.json").read_text())["splits"]["val"]["rows"] == 400


@needs_native
def test_by_day_halves_the_last_day_like_polars(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for day in (0, 1):
        (tmp_path / f"day_{day}").write_text(criteo_text(criteo_rows(301, seed=day)))
    inputs = [str(tmp_path / "day_0"), str(tmp_path / "day_1")]
    fast, slow = run_both(tmp_path, CRITEO, inputs, monkeypatch, split_by_day=True)
    assert_same_dataset(fast, slow)


@needs_native
def test_int_keys_floor_modulo_and_long_hex(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    schema = Schema.from_dict({
        "name": "keys", "format": "tsv", "label": "y", "columns": [
            {"name": "y", "role": "label"},
            {"name": "d", "role": "dense", "type": "int", "transform": "clip", "clip": [-2, 9]},
            {"name": "e", "role": "dense", "type": "int", "transform": "none", "fill": 4},
            {"name": "skip", "role": "ignore"},
            {"name": "h", "role": "sparse", "type": "hex", "hash_size": 2**40 + 7},
            {"name": "i", "role": "sparse", "type": "int", "hash_size": 5},
        ]})
    rows = [["1", "-5", "", "whatever", "ffffffffffffffff", "-3"],
            ["0", "12", "-9223372036854775808", "", "0", "-9223372036854775808"],
            ["1", "", "9223372036854775807", "x", "00000000000000ff", ""]]
    src = write(tmp_path / "in.tsv", rows)
    fast, slow = run_both(tmp_path, schema, [str(src)], monkeypatch)
    assert_same_dataset(fast, slow)
    df = read_split(fast, "train")
    assert df["h"].to_list() == [(2**64 - 1) % (2**40 + 7), 0, 255]
    assert df["i"].to_list() == [2, (-(2**63)) % 5, 0]
    assert df["d"].to_list() == [-2.0, 9.0, 0.0]


@needs_native
@pytest.mark.parametrize("bad", [
    ("label", "2"), ("label", ""), ("dense", "1.5"), ("dense", "+3"),
    ("dense", "99999999999999999999"), ("sparse", "xyz"), ("sparse", "1" * 17),
    ("extra", "0a"),
])
def test_a_row_the_fast_path_doubts_goes_to_polars(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: tuple[str, str]) -> None:
    """Each doubtful row: the fast path leaves nothing and polars decides, in both modes."""
    rows = criteo_rows(200, seed=4)
    where, value = bad
    row = rows[150]
    if where == "label":
        row[0] = value
    elif where == "dense":
        row[4] = value
    elif where == "sparse":
        row[20] = value
    else:
        row.append(value)
    src = tmp_path / "in.tsv"
    src.write_text(criteo_text(rows))
    schema = load_schema(CRITEO)
    layout = fastpath.fast_layout(schema, sparse_kinds(schema))
    assert layout is not None
    target = tmp_path / "part.parquet"
    result = fastpath.stream_fast(layout, src, 0, ("literal", "train"), {"train": target},
                                  64, "lz4", Progress(), block_bytes=2048)
    assert result is None and not target.exists()
    # What polars accepts ("+3" parses as 3) is kept; the rest is an error naming line 151.
    try:
        fast, slow = run_both(tmp_path, CRITEO, [str(src)], monkeypatch, on_bad_rows="skip")
    finally:
        monkeypatch.delenv(fastpath.ENGINE_ENV, raising=False)
    assert_same_dataset(fast, slow)
    if value != "+3":
        with pytest.raises(InputDataError, match=r"in\.tsv:151"):
            preprocess(CRITEO, [str(src)], tmp_path / "strict")


def test_schemas_the_fast_path_does_not_take() -> None:
    avazu = load_schema(Path(__file__).resolve().parents[2] / "schemas" / "avazu.yaml")
    assert fastpath.fast_layout(avazu, sparse_kinds(avazu)) is None  # csv, strings
    small = small_schema()
    assert fastpath.fast_layout(small, sparse_kinds(small)) is None  # float dense, multi-hot
    criteo = load_schema(CRITEO)
    vocab = {n: (k, None, m) for n, (k, _, m) in sparse_kinds(criteo).items()}
    assert fastpath.fast_layout(criteo, vocab) is None  # vocabulary mode


def test_numpy_random_unit_equals_the_polars_expression() -> None:
    rows = np.array([0, 1, 2, 10**6, 2**32 + 5, 4_000_000_000], dtype=np.uint64)
    expected = pl.DataFrame({"r": rows}).select(random_unit(pl.col("r"), 3, 42)).to_series()
    got = fastpath.random_unit_numpy(rows, 3, 42)
    np.testing.assert_array_equal(got, expected.to_numpy())


@needs_native
def test_large_split_summary_matches_the_written_data(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the exact-count size the fast path's manifest comes from what it gathered while
    writing: dense moments to float precision, cardinalities within the sketch's error."""
    from ctrctl.data.stats import EXACT_CARDINALITY_ROWS
    from ctrctl.data.synthetic import synthesize

    rows = EXACT_CARDINALITY_ROWS + 20_000
    synthesize(tmp_path / "logs", rows=rows, format="criteo", seed=0, splits={"train": 1.0})
    fast, slow = run_both(tmp_path, CRITEO, [str(tmp_path / "logs" / "train.tsv")],
                          monkeypatch)
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (fast, slow))
    assert ma["splits"] == mb["splits"]
    for a, b in zip(ma["dense"], mb["dense"], strict=True):
        assert a["name"] == b["name"] and a["missing_rate"] == b["missing_rate"]
        for key in ("mean", "std", "min", "max"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (a["name"], key)
    written = read_split(fast, "train")
    assert written.equals(read_split(slow, "train"))
    for feature in ma["sparse"]:
        exact = written[feature["name"]].n_unique()
        assert feature["cardinality"] == pytest.approx(exact, rel=0.03), feature["name"]


@needs_native
def test_hex_keys_of_every_length_and_case_match_python() -> None:
    """The parser's eight-digits-at-once path and its digit loop, against int(text, 16)."""
    import random

    rng = random.Random(0)
    digits, junk = "0123456789abcdefABCDEF", "gG/:@`x \x7f"
    size = 2**40 + 7  # above 32 bits: the plain modulo, so the id is the key itself
    assert fastpath._fastparse is not None
    for _ in range(3000):
        text = "".join(rng.choice(digits) for _ in range(rng.choice([1, 7, 8, 8, 8, 9, 16, 17])))
        if rng.random() < 0.2:
            at = rng.randrange(len(text))
            text = text[:at] + rng.choice(junk) + text[at + 1:]
        label, sparse = np.empty(2, np.int8), np.empty((1, 2), np.int64)
        rows, bad = fastpath._fastparse.parse_block(
            f"1\t{text}\n".encode(), 9, b"LH", np.array([0, size], np.int64), np.zeros(2),
            b"nn", np.zeros(2), np.zeros(2), 2, label, np.empty((0, 2), np.float32), sparse,
            np.empty(2, np.uint64))
        valid = len(text) <= 16 and all(c in digits for c in text)
        if valid:
            assert (rows, bad) == (1, -1) and sparse[0, 0] == int(text, 16) % size, text
        else:
            assert (rows, bad) == (0, 0), text
