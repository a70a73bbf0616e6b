"""``ctrctl preprocess``: raw click logs to a dataset folder (Parquet splits + manifest)."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.table import Table

from ctrctl.cli.common import (
    Experiment,
    NoTrack,
    OnBadRows,
    OutDir,
    Overwrite,
    TrackingUri,
    console,
    locked,
    make_progress,
    tracker_from,
)
from ctrctl.config import DEFAULT_VAL_FRACTION


def preprocess_command(
    out: OutDir,
    inputs: Annotated[list[str], typer.Option(
        "--input", "-i", help="[SPLIT=]PATH of a raw log (plain or .gz); repeat it. SPLIT is "
        "train, val, test or any other name (holdout=PATH); without one the file goes to "
        "train, or is divided by --split-ratio.")],
    schema: Annotated[Path | None, typer.Option(
        help="Schema YAML (schemas/criteo.yaml, schemas/avazu.yaml, ...).")] = None,
    split_ratio: Annotated[str | None, typer.Option(
        help="Divide inputs without a split at random: train,val,test fractions, e.g. 0.8,0.1,0.1.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random split.")] = 0,
    split_by_day: Annotated[bool, typer.Option(
        "--split-by-day", help="Criteo 1TB: inputs day_0 ... day_N; day N's first half is val, "
        "its second half test.")] = False,
    reuse_transforms: Annotated[Path | None, typer.Option(
        help="Map ids with this dataset's vocabularies and hash sizes (new logs to score).")] = None,
    on_bad_rows: Annotated[OnBadRows, typer.Option(
        help="error: stop at the first malformed row; skip: drop and count such rows "
        "(refused when it would drop a whole class or more than --max-skip-fraction).")] = (
        OnBadRows.error),
    val_fraction: Annotated[float, typer.Option(
        help="With no val input: this share of the training rows (random, --seed) becomes "
        "the val split that training stops early on; 0: none.")] = DEFAULT_VAL_FRACTION,
    max_skip_fraction: Annotated[float, typer.Option(
        help="Most rows of an input --on-bad-rows skip may drop.")] = 0.05,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Preprocess raw logs (Criteo/Avazu or any CSV/TSV/Parquet a schema describes)."""
    from ctrctl.data.preprocess import preprocess

    # kill (SIGTERM) unwinds like Ctrl-C, so the temporary output folder is removed.
    signal.signal(signal.SIGTERM, _interrupt)
    tracker = tracker_from(no_track, tracking_uri, experiment, background=True)
    with locked(out, "preprocess"):
        manifest = preprocess(
            schema, inputs, out, split_ratio=split_ratio, seed=seed, split_by_day=split_by_day,
            reuse_transforms=reuse_transforms, on_bad_rows=on_bad_rows.value,
            val_fraction=val_fraction, max_skip_fraction=max_skip_fraction,
            overwrite=overwrite, progress=make_progress(), tracker=tracker,
        )
    table = Table(title=f"dataset {out}")
    for name in ("split", "rows", "label rate", "files"):
        table.add_column(name, justify="right" if name != "split" else "left")
    for split, info in manifest.splits.items():
        table.add_row(split, f"{info.rows:,}", f"{info.label_rate:.4f}", str(len(info.files)))
    console.print(table)
    carved = manifest.transforms.get("val_carved")
    if carved:
        console.print(f"val: {carved['fraction']:.0%} of the training rows, drawn at random "
                      f"with seed {carved['seed']}")
    bad = {k: v for k, v in manifest.bad_rows.items() if v}
    if bad:
        console.print("skipped rows: " + ", ".join(f"{k} {v:,}" for k, v in bad.items()))
    sizes = manifest.table_sizes()
    console.print(f"{len(manifest.dense)} dense, {len(sizes)} sparse features, "
                  f"{sum(sizes.values()):,} embedding rows")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def register(app: typer.Typer) -> None:
    app.command("preprocess")(preprocess_command)
