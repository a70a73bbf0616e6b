"""Synthetic logs: format, determinism, realism, the click model, and atomic output."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from sklearn.feature_extraction import FeatureHasher
from sklearn.linear_model import SGDClassifier
from sklearn.metrics import roc_auc_score

from ctrctl.data.synthetic import (
    DEFAULT_SPLITS,
    encode_lines,
    encoded_chunks,
    generate_avazu,
    generate_criteo,
    hex_strings,
    parse_assignments,
    split_rows,
    synthesize,
    text_of,
    zipf_ranks,
)
from ctrctl.data.synthetic_model import HASH_TABLE_MAX, RankHashes, click_model
from ctrctl.data.synthetic_specs import AVAZU_COLUMNS, format_spec
from ctrctl.data.synthetic_text import Coded, Dictionary, encode_columns, field_words, text_words
from ctrctl.errors import ConfigError, OutputExistsError
from ctrctl.metrics.functional import MetricError, roc_auc

CRITEO_ROWS = 60_000
HEX = re.compile(r"^[0-9a-f]{8}$")
CRITEO_NAMES = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def read_criteo(path: Path) -> pl.DataFrame:
    """A Criteo TSV as strings (empty field -> null), as a reader of the real file would."""
    return pl.read_csv(
        path, separator="\t", has_header=False, new_columns=CRITEO_NAMES, infer_schema=False
    )


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def criteo_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "criteo"
    synthesize(out, rows=CRITEO_ROWS, format="criteo", seed=7)
    return out


@pytest.fixture(scope="module")
def criteo_train(criteo_logs: Path) -> pl.DataFrame:
    return read_criteo(criteo_logs / "train.tsv")


# ----------------------------------------------------------------------------- layout


def test_writes_one_file_per_split_with_probabilities_and_metadata(criteo_logs: Path) -> None:
    names = sorted(p.name for p in criteo_logs.iterdir())
    assert names == sorted(
        ["synth.json"]
        + [f"{s}.tsv" for s in DEFAULT_SPLITS]
        + [f"{s}.prob.npy" for s in DEFAULT_SPLITS]
    )
    meta = json.loads((criteo_logs / "synth.json").read_text())
    assert meta["format"] == "ctrctl.synth" and meta["version"] == 1
    assert meta["log_format"] == "criteo" and meta["seed"] == 7
    assert meta["rows"] == {"train": 48_000, "val": 6_000, "test": 6_000}
    assert meta["cardinalities"] == format_spec("criteo").cardinalities()
    for split, rows in meta["rows"].items():
        lines = (criteo_logs / f"{split}.tsv").read_bytes().split(b"\n")
        assert lines[-1] == b"" and len(lines) - 1 == rows  # newline-terminated, no header
        prob = np.load(criteo_logs / f"{split}.prob.npy")
        assert prob.dtype == np.float32 and prob.shape == (rows,)
        assert np.all((prob > 0) & (prob < 1))


def test_criteo_lines_have_40_fields_ints_and_lowercase_hex(criteo_logs: Path) -> None:
    text = (criteo_logs / "val.tsv").read_text()
    lines = text.splitlines()
    assert all(line.count("\t") == 39 for line in lines)
    df = read_criteo(criteo_logs / "val.tsv")
    assert set(df["label"].unique().to_list()) == {"0", "1"}
    for i in range(1, 14):
        values = df[f"I{i}"].drop_nulls().cast(pl.Int64)  # raises if not integers
        assert values.min() >= (-3 if i == 2 else 0)
    for i in range(1, 27):
        values = df[f"C{i}"].drop_nulls()
        assert values.str.contains(r"^[0-9a-f]{8}$").all(), f"C{i}"
    assert (df["I2"].cast(pl.Int64) < 0).mean() == pytest.approx(0.10, abs=0.02)


def test_cardinalities_span_a_few_values_to_millions(criteo_train: pl.DataFrame) -> None:
    sizes = format_spec("criteo").cardinalities()
    assert min(sizes.values()) == 3 and max(sizes.values()) > 4_000_000
    # Small vocabularies are fully used; big ones keep producing new values (a long tail).
    assert criteo_train["C6"].drop_nulls().n_unique() == 3
    c20 = criteo_train["C20"].drop_nulls()
    assert c20.n_unique() > 0.2 * len(c20)
    # Zipf: the most frequent value of a big feature is far more common than the median one.
    counts = criteo_train["C1"].value_counts(sort=True)["count"]
    assert counts[0] > 100 * counts[len(counts) // 2]


def test_missing_and_label_rates_in_realistic_ranges(criteo_train: pl.DataFrame) -> None:
    rates = {c: criteo_train[c].is_null().mean() for c in CRITEO_NAMES[1:]}
    expected = {
        "I1": 0.45,
        "I2": 0.0,
        "I12": 0.77,
        "I3": 0.20,
        "C3": 0.033,
        "C19": 0.45,
        "C22": 0.82,
    }
    for name, rate in expected.items():
        assert rates[name] == pytest.approx(rate, abs=0.015), name
    # Columns of one group go missing together, as in the real logs.
    c19 = criteo_train["C19"].is_null()
    assert (c19 == criteo_train["C26"].is_null()).all()
    label = criteo_train["label"].cast(pl.Int8)
    assert 0.20 <= label.mean() <= 0.25


def test_missing_rates_match_the_real_criteo_sample(
    criteo_8k: Path, criteo_train: pl.DataFrame
) -> None:
    real = read_criteo(criteo_8k / "train.csv")
    for name in CRITEO_NAMES[1:]:
        assert criteo_train[name].is_null().mean() == pytest.approx(
            real[name].is_null().mean(), abs=0.03
        ), name
    # Dense medians within a factor of ~2 of the real ones (heavy tails, counts).
    for name in ("I3", "I5", "I6", "I9", "I13"):
        synth_median = criteo_train[name].cast(pl.Int64).median()
        real_median = real[name].cast(pl.Int64).median()
        assert 0.5 <= (synth_median + 1) / (real_median + 1) <= 2.0, name


# ----------------------------------------------------------------------------- determinism


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path, criteo_logs: Path) -> None:
    again = tmp_path / "again"
    synthesize(again, rows=CRITEO_ROWS, format="criteo", seed=7, workers=1)
    assert digest(again) == digest(criteo_logs)
    other = tmp_path / "other"
    synthesize(other, rows=CRITEO_ROWS, format="criteo", seed=8)
    differs = {n for n, h in digest(other).items() if h != digest(criteo_logs)[n]}
    assert differs == set(digest(other))


def test_chunks_do_not_depend_on_the_number_of_threads() -> None:
    rows = 70_000  # two chunks
    texts = [
        b"".join(bytes(text_of(lines)) for _, _, lines in encoded_chunks("avazu", rows, 3, None, w))
        for w in (1, 3)
    ]
    assert texts[0] == texts[1]
    assert texts[0].count(b"\n") == rows


@pytest.mark.parametrize("fmt", ["criteo", "avazu"])
def test_encoded_text_equals_plain_python_formatting(fmt: str) -> None:
    batch = (generate_criteo if fmt == "criteo" else generate_avazu)(3000, seed=5)
    separator = "\t" if fmt == "criteo" else ","
    expected = "".join(
        "\n" + separator.join("" if v is None else str(v) for v in row.values())
        for row in batch.table.to_pylist()
    )
    assert bytes(text_of(encode_lines(batch.table, separator))).decode() == expected


@pytest.mark.parametrize("fmt", ["criteo", "avazu"])
def test_byte_matrix_lines_equal_the_arrow_encoder(fmt: str) -> None:
    raw = click_model(fmt, 4).columns(chunk=1, start_row=0, n=5000, total_rows=5000)
    separator = "\t" if fmt == "criteo" else ","
    expected = bytes(text_of(encode_lines(raw.table(), separator)))
    assert bytes(text_of(raw.lines(separator))) == expected
    # Edge values: negatives, widths of every digit count, the largest uint64, missing.
    values = np.array([0, -1, -3, 9, 10, 9999, 10_000, -10_000, 2**31, 10**12], dtype=np.int64)
    missing = np.arange(len(values)) % 4 == 3
    ids = np.array([2**64 - 1, 0, 1, 10**19, *range(6)], dtype=np.uint64)
    lines = encode_columns(
        [(ids, None), (values, missing), (values.astype(np.uint32), missing)], b","
    )
    rows = zip(
        ids.tolist(), values.tolist(), values.astype(np.uint32).tolist(), missing, strict=True
    )
    assert lines.to_pylist() == [
        f"\n{i},{'' if m else v},{'' if m else format(h, '08x')}" for i, v, h, m in rows
    ]


def _printed(coded: Coded, row: int) -> str:
    """What a reader of the text expects for one row of a coded column."""
    code = int(coded.codes[row])
    if code == coded.dictionary.missing_code:
        return ""
    value = int(coded.dictionary.values[code])
    return f"{value:08x}" if coded.dtype == np.uint32 else str(value)


def test_coded_columns_print_their_dictionary_values_and_missing_codes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ctrctl.data.synthetic_text as synthetic_text

    monkeypatch.setattr(synthetic_text, "_BLOCK_BYTES", 64 * 1000)  # blocks of 1000 rows
    rng = np.random.default_rng(3)
    n = 4500
    wide = Dictionary(np.array([0, -7, 10**9, -(10**15), 2**63 - 1, 42], dtype=np.int64))
    narrow = Dictionary(np.array([5, 1234, -3], dtype=np.int64))
    hashes = Dictionary(rng.integers(0, 2**32, 50, dtype=np.uint64).astype(np.uint32))
    assert [t.dtype for t in narrow.tables()] == [np.uint32]  # 4 characters fit one word
    assert len(wide.tables()) == 3  # 20 characters: three 8-byte words
    coded = [
        Coded(rng.integers(0, len(d) + 1, n).astype(np.intp), d)  # code len(d): missing
        for d in (wide, narrow, hashes)
    ]
    ids = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)  # plain, 20 digits
    lines = encode_columns([(ids, None)] + [(c, None) for c in coded], b"\t")
    assert lines.num_chunks == 5
    assert lines.to_pylist() == [
        "\n" + "\t".join([str(int(ids[i]))] + [_printed(c, i) for c in coded]) for i in range(n)
    ]
    missing = coded[1].missing()
    assert missing is not None and np.array_equal(missing, coded[1].codes == len(narrow))


def test_rank_hashes_tabulate_frequent_ranks_and_hash_rare_ones() -> None:
    hashes = RankHashes(HASH_TABLE_MAX * 3, np.uint32(12345))
    codes = np.array([0, 1, HASH_TABLE_MAX - 1, HASH_TABLE_MAX, 2 * HASH_TABLE_MAX + 7,
                      len(hashes), 3], dtype=np.intp)  # len(hashes): missing
    values = hashes.decode(codes)
    np.testing.assert_array_equal(values[:2], hashes.values[:2])  # the table's hashes
    assert len(np.unique(values[:5])) == 5
    lines = encode_columns([(Coded(codes, hashes), None)], b",")
    expected = [
        "\n" if c == len(hashes) else f"\n{int(v):08x}"
        for c, v in zip(codes, values, strict=True)
    ]
    assert lines.to_pylist() == expected


def test_text_words_right_align_decimal_and_hex_text() -> None:
    values = np.array([0, 7, -12, 99_999_999, -(10**8), 2**63 - 1, -(2**63)], dtype=np.int64)
    words = text_words(values)
    assert words.shape == (len(values), 3)
    texts = [bytes(row.view(np.uint8)).lstrip(b"\0").decode() for row in words]
    assert texts == [str(v) for v in values.tolist()]
    hexes = text_words(np.array([0, 0xDEADBEEF], dtype=np.uint32))
    assert [bytes(r.view(np.uint8)) for r in hexes] == [b"00000000", b"deadbeef"]
    assert [w.dtype for w in field_words(np.array([1, 9999]))] == [np.uint32]
    assert [w.dtype for w in field_words(np.array([1, -9999]))] == [np.uint64]


def test_in_memory_generator_matches_the_files(criteo_logs: Path) -> None:
    batch = generate_criteo(CRITEO_ROWS, seed=7)
    train = np.load(criteo_logs / "train.prob.npy")
    np.testing.assert_array_equal(batch.prob[: len(train)], train)
    assert batch.table.column_names == CRITEO_NAMES
    assert batch.table.num_rows == CRITEO_ROWS


# ----------------------------------------------------------------------------- click model


def test_best_auc_is_the_auc_of_the_true_probability(criteo_logs: Path) -> None:
    meta = json.loads((criteo_logs / "synth.json").read_text())
    for split in DEFAULT_SPLITS:
        prob = np.load(criteo_logs / f"{split}.prob.npy")
        label = read_criteo(criteo_logs / f"{split}.tsv")["label"].cast(pl.Int8).to_numpy()
        assert meta["best_auc"][split] == pytest.approx(roc_auc_score(label, prob), rel=1e-9)
        assert meta["label_rate"][split] == pytest.approx(label.mean())
        assert 0.74 <= meta["best_auc"][split] <= 0.82


def _hashed(df: pl.DataFrame, features: list[str]) -> object:
    rows = [
        [f"{name}={value}" for name, value in zip(features, row, strict=True)]
        for row in df.select(features).fill_null("").iter_rows()
    ]
    return FeatureHasher(n_features=2**18, input_type="string", alternate_sign=False).transform(
        rows
    )


def _logistic_regression() -> SGDClassifier:
    # Logistic loss by SGD: a few epochs fit in a second where a batch solver takes a minute.
    return SGDClassifier(loss="log_loss", alpha=1e-4, max_iter=10, tol=None, random_state=0)


def test_a_hashed_logistic_regression_learns_the_planted_model(
    criteo_logs: Path, criteo_train: pl.DataFrame
) -> None:
    test = read_criteo(criteo_logs / "test.tsv")
    features = ["C1", "C2", "C5", "C6", "C8", "C9", "C13", "C14", "C17", "C20", "C23", "C25"]
    y_train = criteo_train["label"].cast(pl.Int8).to_numpy()
    y_test = test["label"].cast(pl.Int8).to_numpy()
    x_train, x_test = _hashed(criteo_train, features), _hashed(test, features)
    model = _logistic_regression().fit(x_train, y_train)
    auc = roc_auc_score(y_test, model.decision_function(x_test))
    best = json.loads((criteo_logs / "synth.json").read_text())["best_auc"]["test"]
    assert auc > 0.65, auc  # far above chance ...
    assert auc < best + 0.02  # ... and not above what the true probability allows
    # Control: the same model on shuffled labels learns nothing.
    shuffled = np.random.default_rng(0).permutation(y_train)
    control = _logistic_regression().fit(x_train, shuffled)
    assert abs(roc_auc_score(y_test, control.decision_function(x_test)) - 0.5) < 0.04


@pytest.mark.parametrize("fmt", ["criteo", "avazu"])
def test_planted_rows_are_the_printed_rows_and_rebuild_their_logits(fmt: str) -> None:
    model = click_model(fmt, 3)
    n, total = 4000, 70_000  # chunk 1 of a 70k-row stream: not the first chunk, not whole
    planted = model.planted(1, 65_536, n, total)
    batch = model.batch(1, 65_536, n, total)
    assert np.array_equal(planted.prob, batch.prob)
    assert np.array_equal(planted.label, batch.labels)
    spec = model.spec
    for feature in model.features:
        ranks = planted.ranks[feature.spec.name]
        printed = batch.table.column(feature.spec.name)
        present = ranks < feature.spec.cardinality
        values = feature.dictionary.decode(np.where(present, ranks, 0))
        expected = (hex_strings(values, present) if values.dtype == np.uint32
                    else [int(v) if p else None for v, p in zip(values, present, strict=True)])
        assert printed.to_pylist() == (expected.to_pylist() if not isinstance(expected, list)
                                       else expected), feature.spec.name
    # The logit as PlantedRows describes it, part by part, is the probability's.
    logit = np.full(n, model.bias)
    for feature in model.features:
        logit += feature.effects[np.minimum(planted.ranks[feature.spec.name],
                                            len(feature.effects) - 1)]
    for d in spec.dense:
        counts = np.array(batch.table.column(d.name).to_pylist(), dtype=object)
        z = planted.z[d.name]
        normal = np.array([c is not None and c >= 0 for c in counts])
        assert np.all(z[~normal] == 0.0), d.name
        rebuilt = np.minimum(np.floor(d.median * np.exp(np.minimum(d.sigma * z, 20.0))), 2.0**31)
        assert np.array_equal(rebuilt[normal], counts[normal].astype(np.float64)), d.name
        logit += d.effect * spec.effect_scale * z
    if model.pair is not None and spec.interaction is not None:
        a, b, _ = spec.interaction
        logit += model.pair[np.minimum(planted.ranks[a], model.pair.shape[0] - 1),
                            np.minimum(planted.ranks[b], model.pair.shape[1] - 1)]
    if fmt == "avazu":
        hours = np.array(batch.table.column("hour").to_pylist()) % 100
        logit += 0.2 * np.sin(2 * np.pi * hours / 24.0)
    np.testing.assert_allclose(1 / (1 + np.exp(-logit)), planted.prob, rtol=1e-6, atol=1e-7)


def test_zipf_ranks_follow_the_midpoint_rule() -> None:
    k, s = 10, 1.2
    ranks = zipf_ranks(np.random.default_rng(0).random(400_000), k, s)
    edges = np.arange(k + 1) + 0.5
    mass = (edges[1:] ** (1 - s) - edges[:-1] ** (1 - s)) / ((k + 0.5) ** (1 - s) - 0.5 ** (1 - s))
    freq = np.bincount(ranks, minlength=k) / len(ranks)
    np.testing.assert_allclose(freq, mass, atol=0.003)
    assert ranks.max() < k
    big = zipf_ranks(np.random.default_rng(1).random(100_000), 5_000_000, 1.1)
    assert big.max() > 1_000_000 and np.mean(big == 0) > 0.05


def test_hex_strings_and_roc_auc_against_references() -> None:
    values = np.random.default_rng(0).integers(0, 2**32, 1000, dtype=np.uint32)
    valid = np.arange(1000) % 7 != 0
    got = hex_strings(values, valid).to_pylist()
    assert got == [f"{v:08x}" if ok else None for v, ok in zip(values, valid, strict=True)]
    rng = np.random.default_rng(1)
    prob = np.round(rng.random(5000), 2)  # many ties
    label = rng.random(5000) < prob
    # the best AUC of synth.json is the project's one roc_auc(labels, scores)
    assert roc_auc(label, prob) == pytest.approx(roc_auc_score(label, prob), rel=1e-12)
    with pytest.raises(MetricError):
        roc_auc(np.zeros(5000), prob)
    # float32 probabilities take the sorted-key path; ties (many here) count one half.
    prob32 = prob.astype(np.float32)
    assert roc_auc(label, prob32) == pytest.approx(roc_auc_score(label, prob32), rel=1e-12)
    assert roc_auc(np.array([1, 0, 0]), np.array([0.5, 0.5, 0.2], dtype=np.float32)) == 0.75


# ----------------------------------------------------------------------------- avazu


def test_avazu_columns_are_the_real_ones(avazu_9k: Path) -> None:
    real = pl.read_csv(avazu_9k / "train.csv", infer_schema=False, n_rows=10)
    assert real.columns == list(AVAZU_COLUMNS)


def test_avazu_has_the_real_shapes(tmp_path: Path) -> None:
    out = tmp_path / "avazu"
    result = synthesize(out, rows=20_000, format="avazu", seed=1)
    train = pl.read_csv(out / "train.csv", infer_schema=False)
    assert train.columns == list(AVAZU_COLUMNS)
    assert train.null_count().sum_horizontal().item() == 0  # Avazu has no empty fields
    for name in ("site_id", "app_id", "device_id", "device_ip", "device_model"):
        assert train[name].str.contains(r"^[0-9a-f]{8}$").all(), name
    hours = train["hour"].cast(pl.Int64)
    assert hours.min() == 14102100 and hours.is_sorted()
    assert (hours % 100).max() <= 23
    train["id"].cast(pl.UInt64)  # numeric ids
    for name in ("C1", "banner_pos", "device_type", "C14", "C15", "C16", "C17", "C20", "C21"):
        train[name].cast(pl.Int64)
    # Real shapes: most devices anonymous (one placeholder), each row is site or app traffic.
    top_device = train["device_id"].value_counts(sort=True)["count"][0] / len(train)
    assert top_device == pytest.approx(0.87, abs=0.02)
    app_placeholder = train["app_id"].value_counts(sort=True)["app_id"][0]
    site_placeholder = train["site_id"].value_counts(sort=True)["site_id"][0]
    is_site = train["app_id"] == app_placeholder
    assert ((train["site_id"] == site_placeholder) ^ is_site).all()
    assert result.label_rate["train"] == pytest.approx(0.17, abs=0.02)
    assert 0.72 <= result.best_auc["test"] <= 0.82


def test_generate_avazu_in_memory() -> None:
    batch = generate_avazu(1000, seed=2)
    assert batch.table.column_names == list(AVAZU_COLUMNS)
    assert batch.labels.shape == (1000,)


# ----------------------------------------------------------------------------- output


def test_existing_output_is_refused_then_replaced_with_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    synthesize(out, rows=500, seed=0)
    before = digest(out)
    with pytest.raises(OutputExistsError, match="already exists"):
        synthesize(out, rows=500, seed=1)
    assert digest(out) == before
    synthesize(out, rows=500, seed=1, overwrite=True)
    assert digest(out) != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]  # no temp folder left


def test_a_failure_leaves_no_output_and_no_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ctrctl.data.synthetic as synthetic

    def broken(*args: object, **kwargs: object) -> object:
        yield from ()
        raise OSError("disk full")

    monkeypatch.setattr(synthetic, "encoded_chunks", broken)
    with pytest.raises(OSError, match="disk full"):
        synthesize(tmp_path / "logs", rows=100)
    assert list(tmp_path.iterdir()) == []


def test_splits_and_options_are_validated(tmp_path: Path) -> None:
    assert split_rows(1001, DEFAULT_SPLITS) == {"train": 800, "val": 100, "test": 101}
    assert parse_assignments(["train=0.5", "test=0.5"], float, "--split") == {
        "train": 0.5,
        "test": 0.5,
    }
    with pytest.raises(ConfigError, match="sum to 0.9"):
        split_rows(10, {"train": 0.8, "test": 0.1})
    with pytest.raises(ConfigError, match="NAME=FLOAT"):
        parse_assignments(["train"], float, "--split")
    with pytest.raises(ConfigError, match="unknown log format"):
        synthesize(tmp_path / "x", rows=10, format="kdd")
    with pytest.raises(ConfigError, match="C99"):
        synthesize(tmp_path / "x", rows=10, cardinalities={"C99": 3})
    assert not (tmp_path / "x").exists()


def test_custom_splits_and_cardinalities(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    result = synthesize(
        out, rows=3000, seed=0, splits={"train": 0.5, "test": 0.5}, cardinalities={"C3": 5}
    )
    assert result.rows == {"train": 1500, "test": 1500}
    assert sorted(p.name for p in out.iterdir()) == [
        "synth.json",
        "test.prob.npy",
        "test.tsv",
        "train.prob.npy",
        "train.tsv",
    ]
    assert read_criteo(out / "train.tsv")["C3"].drop_nulls().n_unique() == 5
    assert result.cardinalities["C3"] == 5
