"""Preprocess jobs: one per input file, each with the rule that sends its rows to a split
(named split, ratio, a carved validation share, or the halves of the last day) and the
Parquet parts it writes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from ctrctl.data.fastpath import SplitRule
from ctrctl.data.guards import carve_plan
from ctrctl.data.interactions import leave_last_out_applies, leave_last_out_split, positive_rows
from ctrctl.data.readers import InputSource, ScannedInput, day_of, reading, scan_input
from ctrctl.data.schema import Schema
from ctrctl.data.transforms import ROW, random_unit
from ctrctl.errors import ConfigError


@dataclass
class _Target:
    """One Parquet part: rows of one input going to one split."""

    split: str
    path: Path


@dataclass
class _Job:
    source: InputSource
    index: int
    scan: ScannedInput
    targets: list[_Target] = field(default_factory=list)
    split_expr: pl.Expr | None = None
    #: The same rule in plain terms, for the native fast path (``ctrctl.data.fastpath``).
    split_rule: SplitRule | None = None


def _parse_ratio(text: str | Sequence[float] | None) -> tuple[float, float, float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in (text.split(",") if isinstance(text, str) else text)]
    except ValueError as exc:
        raise ConfigError(f"--split-ratio {text!r} is not three numbers",
                          hint="e.g. --split-ratio 0.8,0.1,0.1") from exc
    if len(values) != 3 or min(values) < 0 or abs(sum(values) - 1.0) > 1e-6:
        raise ConfigError(f"--split-ratio {text!r} must be three non-negative numbers summing to 1",
                          hint="e.g. --split-ratio 0.8,0.1,0.1")
    return values[0], values[1], values[2]


def _plan_jobs(
    schema: Schema,
    sources: list[InputSource],
    ratio: tuple[float, float, float] | None,
    seed: int,
    split_by_day: bool,
    val_fraction: float = 0.0,
) -> list[_Job]:
    jobs = [_Job(s, i, scan_input(schema, s.path)) for i, s in enumerate(sources)]
    carve = carve_plan(sources, ratio, split_by_day, val_fraction)
    last_day = max(day_of(s.path) for s in sources) if split_by_day else None
    if schema.interactions is not None:
        _plan_interactions(schema, jobs, sources, ratio, split_by_day)
        if leave_last_out_applies(schema, sources, ratio, split_by_day):
            return jobs
    for job in jobs:
        source = job.source
        if split_by_day:
            if source.split is not None:
                raise ConfigError("--split-by-day takes inputs without a split name",
                                  where=f"{source.split}={source.path}")
            if day_of(source.path) == last_day:
                # The last day is halved in file order: first half val, second half test.
                with reading(source.path):
                    rows = job.scan.frame.select(pl.len()).collect(engine="streaming").item()
                job.split_expr = pl.when(pl.col(ROW) < rows // 2).then(pl.lit("val"))
                job.split_expr = job.split_expr.otherwise(pl.lit("test"))
                job.split_rule = ("halves", rows // 2)
            else:
                job.split_expr = pl.lit("train")
                job.split_rule = ("literal", "train")
        elif source.split is None and ratio is not None:
            u = random_unit(pl.col(ROW), job.index, seed)
            job.split_expr = (
                pl.when(u < ratio[0]).then(pl.lit("train"))
                .when(u < ratio[0] + ratio[1]).then(pl.lit("val"))
                .otherwise(pl.lit("test"))
            )
            job.split_rule = ("ratio", (ratio[0], ratio[1]), job.index, seed)
        elif carve and source.split in (None, "train"):
            # A seeded random share of the training rows becomes the validation split.
            u = random_unit(pl.col(ROW), job.index, seed)
            job.split_expr = pl.when(u < 1.0 - val_fraction).then(pl.lit("train")).otherwise(
                pl.lit("val"))
            job.split_rule = ("ratio", (1.0 - val_fraction, val_fraction), job.index, seed)
        else:
            job.split_expr = pl.lit(source.split or "train")
            job.split_rule = ("literal", source.split or "train")
    return jobs


def _plan_interactions(schema: Schema, jobs: list[_Job], sources: list[InputSource],
                       ratio: tuple[float, float, float] | None, split_by_day: bool) -> None:
    """Keep positives only; with no split named, divide them leave-last-out.

    Leave-last-out ranks each user's rows over the whole input, so the inputs are read as
    one frame (one job); the native fast path neither filters nor ranks, so it is not used.
    """
    for job in jobs:
        job.scan = replace(job.scan, frame=job.scan.frame.filter(positive_rows(schema)))
    if not leave_last_out_applies(schema, sources, ratio, split_by_day):
        return
    if len(jobs) > 1:
        raise ConfigError(
            "leave-last-out splits one interaction log; got several inputs",
            hint="concatenate the logs into one file, or pass --split-ratio")
    jobs[0].split_expr = leave_last_out_split(schema)
    jobs[0].split_rule = None
