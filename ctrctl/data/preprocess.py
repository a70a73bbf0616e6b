"""Raw click logs to a dataset folder: Parquet splits, vocabularies and ``manifest.json``.

Each input is scanned lazily (polars), parsed and validated with vectorised expressions and
streamed to Parquet (``sink_parquet``) in row groups sized for loading, so peak memory does not
grow with the input. The sink and the counting of one input share one scan (``collect_all``);
an input divided between splits goes through one partitioned sink.
In vocabulary mode the parsed keys are staged first, vocabularies are counted on the staged
training split, and a second streaming pass maps keys to ids.

Output is written to a staging folder beside ``out`` (:mod:`ctrctl.io`) and renamed at the
end; a failure removes it, and a stale one left by a killed run is removed by the next run.
Nothing at ``out`` is ever partial.

Example:
    >>> manifest = preprocess("schemas/criteo.yaml", ["train=train.txt", "val=dev.txt"],
    ...                       "dataset")
    >>> manifest.splits["train"].rows
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import polars as pl

from ctrctl.config import DEFAULT_VAL_FRACTION
from ctrctl.data.fastpath import SUMMARY, SplitSummary, fast_layout, stream_fast
from ctrctl.data.guards import carve_plan, check_skipped
from ctrctl.data.interactions import leave_last_out_applies
from ctrctl.data.jobs import _Job, _parse_ratio, _plan_jobs, _Target
from ctrctl.data.manifest import DatasetManifest, SplitInfo
from ctrctl.data.readers import (
    SPLIT_NAMES,
    InputSource,
    parse_input,
    reading,
)
from ctrctl.data.schema import Schema, load_schema
from ctrctl.data.stats import EXACT_CARDINALITY_ROWS, dataset_features, locate_bad_row
from ctrctl.data.transforms import (
    BAD,
    BAD_REASONS,
    RAW_KEYS,
    ROW,
    SPLIT,
    parsed_columns,
    sparse_kinds,
)
from ctrctl.data.vocab import (
    VOCAB_DIR,
    build_vocabs,
    encode,
    encode_file,
    load_vocabs,
    save_vocabs,
)
from ctrctl.errors import ConfigError, InputDataError
from ctrctl.io import (
    check_destination,
    file_sha256,
    refuse_output_over_inputs,
    staged_folder,
    writing,
)
from ctrctl.progress import Progress
from ctrctl.tracking import Tracker

logger = logging.getLogger(__name__)

BadRows = Literal["error", "skip"]
#: ``--on-bad-rows skip`` refuses to drop more than this share of an input's rows.
DEFAULT_MAX_SKIP_FRACTION = 1.0
#: Rows per Parquet row group: large enough for fast scans, small enough to load one at a time.
ROW_GROUP_SIZE = 65_536
#: lz4 decodes and encodes several times faster than zstd at a modest size cost.
COMPRESSION: Literal["lz4"] = "lz4"
#: polars reads CSV in chunks sized from the file by default, so its buffers grow with the
#: input (~370 MB at 1M Criteo rows); 4 MiB chunks cost no throughput and keep peak memory
#: nearly flat. A value already set in the environment wins.
CSV_CHUNK_BYTES = 4 << 20




def preprocess(
    schema: Schema | str | Path | None,
    inputs: Sequence[str | InputSource],
    out: str | Path,
    *,
    split_ratio: str | Sequence[float] | None = None,
    seed: int = 0,
    split_by_day: bool = False,
    reuse_transforms: str | Path | None = None,
    on_bad_rows: BadRows = "error",
    val_fraction: float = DEFAULT_VAL_FRACTION,
    max_skip_fraction: float = DEFAULT_MAX_SKIP_FRACTION,
    overwrite: bool = False,
    row_group_size: int = ROW_GROUP_SIZE,
    progress: Progress | None = None,
    tracker: Tracker | None = None,
) -> DatasetManifest:
    """Preprocess raw logs into a dataset folder ``out`` and return its manifest.

    Args:
        schema: a :class:`Schema` or a schema YAML path; None with ``reuse_transforms``
            takes the followed dataset's schema.
        inputs: ``[SPLIT=]PATH`` strings or :class:`InputSource`; a path without a split
            goes to train, or is divided at random when ``split_ratio`` is given.
        out: the dataset folder to create.
        split_ratio: "train,val,test" fractions (e.g. "0.8,0.1,0.1") for unnamed inputs.
        seed: the seed of the random split (same input + seed -> identical output).
        split_by_day: Criteo 1TB: ``day_N`` inputs, the last day halved into val and test.
        reuse_transforms: a dataset folder whose vocabularies and hash sizes to apply
            (new logs for evaluation or scoring); the manifest records it as ``follows``.
        on_bad_rows: ``error`` stops at the first malformed row naming file, line and
            column; ``skip`` drops such rows and counts them per reason.
        val_fraction: with no ``val`` input (and no ``split_ratio`` or ``split_by_day``),
            this share of the training rows, drawn with ``seed``, becomes the ``val`` split
            (so training can stop early); 0 keeps every training row.
        max_skip_fraction: with ``on_bad_rows="skip"``, refuse when more than this share
            of an input's rows would be dropped, or when dropping them would leave a split
            with one label only while the input held both.
        overwrite: replace an existing ``out``.
        row_group_size: rows per Parquet row group.
        progress: reports rows as they stream.
        tracker: MLflow tracking (one run "preprocess"); None tracks nothing.

    Raises:
        InputDataError, SchemaError, ConfigError, OutputExistsError, DatasetError.
    """
    started = time.perf_counter()
    os.environ.setdefault("POLARS_CSV_CHUNK_SIZE", str(CSV_CHUNK_BYTES))
    progress = progress or Progress()
    tracker = tracker or Tracker()
    out = Path(out)
    followed: DatasetManifest | None = None
    if reuse_transforms is not None:
        followed = DatasetManifest.load(reuse_transforms)
        schema = _follow_schema(schema, followed, Path(reuse_transforms))
    if schema is None:
        raise ConfigError("no schema given", hint="pass --schema schemas/<name>.yaml")
    if not isinstance(schema, Schema):
        schema = load_schema(schema)
    if on_bad_rows not in ("error", "skip"):
        raise ConfigError(f"--on-bad-rows must be error or skip, not {on_bad_rows!r}")
    sources = [s if isinstance(s, InputSource) else parse_input(s) for s in inputs]
    if not sources:
        raise InputDataError("no input given", hint="pass --input [SPLIT=]PATH")
    ratio = _parse_ratio(split_ratio)
    if split_by_day and ratio is not None:
        raise ConfigError("--split-by-day and --split-ratio exclude each other")
    refuse_output_over_inputs(out, [s.path for s in sources] + (
        [Path(reuse_transforms)] if reuse_transforms is not None else []))
    check_destination(out, overwrite)
    if not 0.0 <= val_fraction < 1.0 or not 0.0 <= max_skip_fraction <= 1.0:
        raise ConfigError("--val-fraction must be in [0, 1) and --max-skip-fraction in [0, 1]")
    if leave_last_out_applies(schema, sources, ratio, split_by_day):
        val_fraction = 0.0  # the split already holds a val row per user
    carved = carve_plan(sources, ratio, split_by_day, val_fraction)
    if carved:
        logger.info("no val input: %.0f%% of the training rows (random, seed %d) become the "
                    "val split", 100 * val_fraction, seed)

    with tracker.run("preprocess") as run:
        run.log_params({
            "schema": schema.name, "schema_hash": schema.content_hash(),
            "inputs": [f"{s.split or '-'}={s.path}" for s in sources],
            "split_ratio": ratio, "seed": seed, "split_by_day": split_by_day,
            "on_bad_rows": on_bad_rows, "reuse_transforms": reuse_transforms,
            "val_fraction": val_fraction if carved else 0.0,
        })
        run.log_dict(schema.to_dict(), "schema.json")
        with writing(out), staged_folder(out, overwrite=overwrite) as staging:
            manifest, timings = _run(schema, sources, staging, ratio, seed, split_by_day,
                                     followed, reuse_transforms, on_bad_rows, row_group_size,
                                     progress, val_fraction if carved else 0.0,
                                     max_skip_fraction)
        seconds = time.perf_counter() - started
        total = sum(s.rows for s in manifest.splits.values())
        run.log_metrics({
            **{f"rows.{k}": v.rows for k, v in manifest.splits.items()},
            **{f"label_rate.{k}": v.label_rate for k, v in manifest.splits.items()},
            **{f"bad_rows.{k}": v for k, v in manifest.bad_rows.items()},
            **{f"seconds.{k}": v for k, v in timings.items()},
            "seconds.total": seconds, "rows_per_s": total / max(seconds, 1e-9),
        })
        run.log_artifact(out / "manifest.json")
    logger.info("wrote %s: %s rows in %.1f s (%s)", out, f"{total:,}", seconds,
                ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    return manifest


def _follow_schema(schema: Schema | str | Path | None, followed: DatasetManifest,
                   folder: Path) -> Schema:
    own = Schema.from_dict(followed.schema, where=str(folder / "manifest.json"))
    if schema is None:
        return own
    given = schema if isinstance(schema, Schema) else load_schema(schema)
    if given.content_hash() != own.content_hash():
        raise ConfigError(
            "--schema differs from the schema of the --reuse-transforms dataset",
            where=str(folder), hint="drop --schema to use the dataset's own schema",
        )
    return own


def _run(
    schema: Schema,
    sources: list[InputSource],
    temp: Path,
    ratio: tuple[float, float, float] | None,
    seed: int,
    split_by_day: bool,
    followed: DatasetManifest | None,
    followed_dir: str | Path | None,
    on_bad_rows: BadRows,
    row_group_size: int,
    progress: Progress,
    val_fraction: float = 0.0,
    max_skip_fraction: float = 1.0,
) -> tuple[DatasetManifest, dict[str, float]]:
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    kinds = sparse_kinds(schema)
    vocab_features = [n for n, (_, size, _) in kinds.items() if size is None]
    # Vocabulary features are staged as keys and encoded in a second, batched pass.
    staged = bool(vocab_features)
    vocabs: dict[str, pl.DataFrame] = {}
    if followed is not None:
        _check_polars_version(followed, kinds)
        vocabs = load_vocabs(Path(followed_dir or "."), vocab_features)
    # Input hashes are computed beside the parse (hashlib releases the GIL).
    hasher = ThreadPoolExecutor(max_workers=1)
    digests = {s.path: hasher.submit(file_sha256, s.path) for s in sources}
    hasher.shutdown(wait=False)
    jobs = _plan_jobs(schema, sources, ratio, seed, split_by_day, val_fraction)
    stage_dir = temp / "_staged" if staged else temp
    for job in jobs:
        _assign_targets(job, stage_dir)
    timings["scan_setup"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    estimate = [j.scan.estimated_rows for j in jobs]
    total = sum(e for e in estimate if e) if all(estimate) else None
    progress.start("preprocess", total=total, unit="rows", estimate=True)
    counts: list[dict[str, dict[str, int]]] = []
    try:
        for job in jobs:
            with reading(job.source.path):  # a truncated gzip input: one clear error
                counts.append(_stream_job(schema, job, kinds, vocabs, staged, on_bad_rows,
                                          row_group_size, progress))
    finally:
        progress.finish(completed=len(counts) == len(jobs))
    timings["stream"] = time.perf_counter() - t0
    if on_bad_rows == "skip":
        for job, count in zip(jobs, counts, strict=True):
            check_skipped(job.source.path, count, max_skip_fraction)

    if staged:
        t0 = time.perf_counter()
        if followed is None:
            train_parts = [t.path for j in jobs for t in j.targets if t.split == "train"]
            if not train_parts:
                raise ConfigError("vocabulary mode needs a train split to count values on",
                                  hint="add --input train=PATH or reuse a dataset's transforms")
            min_counts = {c.name: c.min_count for c in schema.sparse if c.min_count is not None}
            multi = {n: m for n, (_, _, m) in kinds.items()}
            vocabs = build_vocabs(train_parts, min_counts, multi)
        timings["vocab"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for job in jobs:
            for target in job.targets:
                final = temp / target.path.relative_to(stage_dir)
                final.parent.mkdir(parents=True, exist_ok=True)
                encode_file(target.path, final, kinds, vocabs, row_group_size, COMPRESSION)
                target.path = final
        shutil.rmtree(stage_dir)
        timings["encode"] = time.perf_counter() - t0
    if vocabs:
        save_vocabs(vocabs, temp)
    _number_parts(jobs)

    t0 = time.perf_counter()
    hashes = {path: future.result() for path, future in digests.items()}
    manifest = _manifest(schema, jobs, counts, kinds, vocabs, temp, followed, followed_dir,
                         ratio, seed, split_by_day, on_bad_rows, row_group_size, hashes)
    if val_fraction:
        manifest = replace(manifest, transforms={
            **manifest.transforms,
            "val_carved": {"from": "train", "fraction": val_fraction, "seed": seed}})
    manifest.save(temp)
    timings["stats"] = time.perf_counter() - t0
    return manifest, timings


def _number_parts(jobs: list[_Job]) -> None:
    """Rename each split's parts to part-00000, part-00001, ... in input order."""
    for split in _split_order(jobs):
        targets = [t for j in jobs for t in j.targets if t.split == split]
        for number, target in enumerate(targets):
            final = target.path.with_name(f"part-{number:05d}.parquet")
            if final != target.path:
                target.path.rename(final)
                target.path = final


def _check_polars_version(followed: DatasetManifest, kinds: dict[str, Any]) -> None:
    if not any(kind == "string" for kind, _, _ in kinds.values()):
        return
    theirs = followed.transforms.get("polars_version")
    if theirs != pl.__version__:
        raise ConfigError(
            f"string features were hashed with polars {theirs}; this is polars "
            f"{pl.__version__}, whose string hash may differ",
            hint=f"install polars=={theirs} or preprocess the training logs again",
        )


def _split_order(jobs: Sequence[_Job]) -> list[str]:
    """train, val, test, then the other named splits in input order."""
    names = list(SPLIT_NAMES)
    for job in jobs:
        if job.source.split is not None and job.source.split not in names:
            names.append(job.source.split)
    return names


def _assign_targets(job: _Job, folder: Path) -> None:
    index = job.index
    names = list(SPLIT_NAMES)
    if job.source.split is not None and job.source.split not in names:
        names.append(job.source.split)
    for split in names:
        job.targets.append(_Target(split, folder / split / f"part-{index:05d}.parquet"))


def _stream_job(
    schema: Schema,
    job: _Job,
    kinds: dict[str, tuple[str, int | None, bool]],
    vocabs: dict[str, pl.DataFrame],
    staged: bool,
    on_bad_rows: BadRows,
    row_group_size: int,
    progress: Progress,
) -> dict[str, dict[str, int]]:
    """Stream one input to its Parquet parts; returns per-split counts.

    Inputs the native parser can take go through it (``ctrctl.data.fastpath``); the rest, and
    any input with a row it does not take, go through polars. The caller reads it inside
    :func:`reading`, so a truncated gzip input is one error naming the line where its data
    stops.
    """
    possible = _possible_splits(job)
    job.targets = [t for t in job.targets if t.split in possible]
    paths = {t.split: t.path for t in job.targets}
    layout = (None if staged or job.split_rule is None or schema.interactions is not None
              else fast_layout(schema, kinds))
    if layout is not None:
        assert job.split_rule is not None
        counted = _CountedProgress(progress)
        fast = stream_fast(layout, job.source.path, job.scan.header_lines, job.split_rule,
                           paths, row_group_size, COMPRESSION, counted)
        if fast is not None:
            return _keep_filled_targets(job, fast, possible)
        logger.info("%s has rows the fast path does not take; reading it again with polars",
                    job.source.path)
        progress.advance(-counted.done)
    columns, bad = parsed_columns(schema)
    names = [c.meta.output_name() for c in columns]
    assert job.split_expr is not None

    def tick(rows: pl.Series) -> pl.Series:
        progress.advance(len(rows))
        return rows

    missing = [pl.col(c.name).is_null().alias(f"__missing.{c.name}") for c in schema.dense]
    frame = job.scan.frame.with_columns(
        pl.col(ROW).map_batches(tick, is_elementwise=True, return_dtype=pl.UInt32)
    ).select(pl.col(ROW), *columns, *missing, bad, job.split_expr.alias(SPLIT))
    good = pl.col(BAD) == 0
    kept = frame.filter(good) if on_bad_rows == "skip" else frame
    data = kept.select(*names, SPLIT)
    if not staged:  # ids now; staged keys get theirs once the vocabularies are counted
        data = encode(data, kinds, vocabs)
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    if len(possible) == 1:
        part = data.filter(pl.col(SPLIT) == possible[0]).drop(SPLIT)
        sink = part.sink_parquet(paths[possible[0]], compression=COMPRESSION,
                                 row_group_size=row_group_size, lazy=True)
    else:  # one partitioned sink: the rows are split once, not filtered once per split
        base = job.targets[0].path.parent.parent
        # The provider's path is taken below ``base`` (a relative output folder given as is
        # would land inside itself).
        below = {split: path.relative_to(base) for split, path in paths.items()}
        sink = data.sink_parquet(
            pl.PartitionBy(base, key=SPLIT, include_key=False,
                           file_path_provider=lambda args: below[args.partition_keys[SPLIT][0]],
                           approximate_bytes_per_file=None),
            compression=COMPRESSION, row_group_size=row_group_size, lazy=True)
    aggregates = [
        pl.len().alias("rows_read"),
        good.sum().alias("rows"),
        pl.col(schema.label).filter(good).cast(pl.Int64).sum().alias("positives"),
        *[(pl.col(BAD) == i + 1).sum().alias(r) for i, r in enumerate(BAD_REASONS)],
        pl.col(ROW).filter(~good).min().alias("first_bad"),
        *[pl.col(f"__missing.{c.name}").filter(good).sum() for c in schema.dense],
    ]
    if len(possible) == 1:  # one split: a plain aggregation, cheaper than a group-by
        summary = frame.select(*aggregates, pl.lit(possible[0]).alias(SPLIT))
    else:
        summary = frame.group_by(SPLIT).agg(aggregates)
    try:
        with reading(job.source.path):
            results = pl.collect_all([sink, summary.lazy()], engine="streaming")
    except pl.exceptions.PolarsError as exc:
        raise InputDataError(f"cannot read input: {exc}", where=str(job.source.path)) from exc
    table = results[-1]
    counts = {row[SPLIT]: row for row in table.iter_rows(named=True)}
    bad_rows = sum(sum(int(r[k]) for k in BAD_REASONS) for r in counts.values())
    if bad_rows and on_bad_rows == "error":
        first = min(int(r["first_bad"]) for r in counts.values() if r["first_bad"] is not None)
        raise locate_bad_row(schema, job.scan, job.source.path, first, bad_rows)
    return _keep_filled_targets(job, counts, possible)


class _CountedProgress(Progress):
    """Forwards to ``inner`` and counts what was done, to take it back on a fallback."""

    def __init__(self, inner: Progress):
        self.inner = inner
        self.done = 0.0

    def advance(self, amount: float = 1, **fields: Any) -> None:
        self.done += amount
        self.inner.advance(amount, **fields)


def _keep_filled_targets(job: _Job, counts: dict[str, dict[str, Any]],
                         possible: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Counts for every possible split; a split that received no rows keeps no (empty) part."""
    for split in possible:
        counts.setdefault(split, {"rows": 0, "rows_read": 0, "positives": 0})
    for target in list(job.targets):
        if counts[target.split]["rows"] == 0:
            target.path.unlink(missing_ok=True)
            job.targets.remove(target)
    return counts


def _merged_summary(counts: list[dict[str, dict[str, Any]]], split: str) -> SplitSummary | None:
    """The fast path's summary of ``split`` over all inputs; None if any input lacks one."""
    merged: SplitSummary | None = None
    for count in counts:
        entry = count.get(split, {})
        if not entry.get("rows"):
            continue
        summary = entry.get(SUMMARY)
        if summary is None:
            return None
        merged = summary if merged is None else merged.merge(summary)
    return merged


def _possible_splits(job: _Job) -> tuple[str, ...]:
    expr = job.split_expr
    assert expr is not None
    try:
        value = pl.select(expr).item()
    except pl.exceptions.PolarsError:
        return SPLIT_NAMES
    return (value,) if isinstance(value, str) else SPLIT_NAMES


def _manifest(
    schema: Schema,
    jobs: list[_Job],
    counts: list[dict[str, dict[str, Any]]],
    kinds: dict[str, tuple[str, int | None, bool]],
    vocabs: dict[str, pl.DataFrame],
    folder: Path,
    followed: DatasetManifest | None,
    followed_dir: str | Path | None,
    ratio: tuple[float, float, float] | None,
    seed: int,
    split_by_day: bool,
    on_bad_rows: BadRows,
    row_group_size: int,
    hashes: dict[Path, str],
) -> DatasetManifest:
    splits: dict[str, SplitInfo] = {}
    for split in _split_order(jobs):
        files = [str(t.path.relative_to(folder)) for j in jobs for t in j.targets
                 if t.split == split]
        rows = sum(int(c.get(split, {}).get("rows", 0)) for c in counts)
        if not files:
            continue
        positives = sum(int(c.get(split, {}).get("positives", 0)) for c in counts)
        splits[split] = SplitInfo(rows=rows, label_rate=positives / max(rows, 1),
                                  files=tuple(sorted(files)))
    if not splits:
        raise InputDataError("no rows left to write",
                             hint="every row was malformed and skipped; check the schema")
    bad_totals = {r: sum(int(v.get(r, 0)) for c in counts for v in c.values())
                  for r in BAD_REASONS}
    inputs = []
    for job, count in zip(jobs, counts, strict=True):
        inputs.append({
            "path": str(job.source.path.resolve()),
            "split": job.source.split,
            "bytes": job.source.path.stat().st_size,
            "sha256": hashes[job.source.path],
            "rows": {s: int(v["rows"]) for s, v in count.items() if v.get("rows")},
            "bad_rows": {r: sum(int(v.get(r, 0)) for v in count.values()) for r in BAD_REASONS},
        })
    stats_split = next(s for s in ("train", "val", "test") if s in splits)
    missing = {c.name: sum(int(v.get(f"__missing.{c.name}", 0) or 0)
                           for cnt in counts for s, v in cnt.items() if s == stats_split)
               for c in schema.dense}
    dense, sparse = dataset_features(schema, kinds, vocabs, folder,
                                     [folder / f for f in splits[stats_split].files],
                                     missing, splits[stats_split].rows, followed,
                                     _merged_summary(counts, stats_split))
    follows = None
    if followed is not None:
        follows = {"path": str(Path(followed_dir or ".").resolve()),
                   "manifest_hash": followed.content_hash(),
                   "schema_hash": followed.schema_hash}
    transforms = {
        "dense": {c.name: {"transform": c.transform, "fill": c.fill, "clip": c.clip,
                           "type": c.value_type} for c in schema.dense},
        "sparse": {name: {"mode": "zch" if size == RAW_KEYS else "hash" if size else "vocab",
                          "kind": kind,
                          "hash_size": size, "multi_hot": multi}
                   for name, (kind, size, multi) in kinds.items()},
        "vocab_dir": VOCAB_DIR if vocabs else None,
        "split_ratio": ratio, "seed": seed, "split_by_day": split_by_day,
        "on_bad_rows": on_bad_rows, "row_group_size": row_group_size,
        "compression": COMPRESSION, "polars_version": pl.__version__,
        "string_hash_seed": 0,
        "cardinality": "exact" if splits[stats_split].rows <= EXACT_CARDINALITY_ROWS
        else "approximate (HyperLogLog)",
    }
    return DatasetManifest(
        label=schema.label, dense=dense, sparse=sparse, splits=splits,
        schema=schema.to_dict(), schema_hash=schema.content_hash(), inputs=tuple(inputs),
        transforms=transforms, bad_rows=bad_totals, follows=follows,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
