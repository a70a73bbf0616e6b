"""``ctrctl predict``: score a dataset split or raw logs with a serving artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ctrctl.cli.common import (
    Experiment,
    NoTrack,
    Overwrite,
    TrackingUri,
    console,
    locked,
    output_file,
    tracker_from,
)


def predict_command(
    model: Annotated[Path, typer.Option(help="Serving artifact folder (ctrctl quantize).")],
    out: Annotated[Path, typer.Option("--out", "-o", callback=output_file,
                                      help="Scores Parquet file.")],
    dataset: Annotated[Path | None, typer.Option(
        help="Preprocessed dataset with the model's transforms.")] = None,
    split: Annotated[str, typer.Option(help="Split of --dataset to score.")] = "test",
    input: Annotated[Path | None, typer.Option(
        "--input", help="Raw logs in the model's schema (instead of --dataset); logs "
        "without the label column score to a score-only file.")] = None,
    batch_size: Annotated[int, typer.Option(help="Rows per scoring batch.")] = 8192,
    compile: Annotated[bool, typer.Option(
        "--compile", help="Compile the program for this machine first (TorchInductor, needs a "
        "C++ compiler; some seconds, then faster scoring; uncompiled with a warning where it "
        "cannot).")] = False,
    verify: Annotated[Path | None, typer.Option(
        "--verify", help="Key file: require the artifact's signature made with it "
        "(`ctrctl quantize --sign`).")] = None,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Write label + score Parquet (what `ctrctl eval --predictions` reads); score only for
    raw logs without labels."""
    from ctrctl.errors import ConfigError
    from ctrctl.inference.predictor import predict_dataset, predict_raw

    if (dataset is None) == (input is None):
        raise ConfigError("give one of --dataset and --input", hint="not both")
    tracker = tracker_from(no_track, tracking_uri, experiment, background=True)
    with locked(out, "predict"):
        if dataset is not None:
            result = predict_dataset(model, dataset, split, out, batch_size=batch_size,
                                     overwrite=overwrite, compile=compile, verify_key=verify)
        else:
            assert input is not None
            result = predict_raw(model, input, out, batch_size=batch_size, overwrite=overwrite,
                                 compile=compile, verify_key=verify)
    # Tracked once the scores are written: a refused input leaves no run and no store.
    with tracker.run("predict") as run:
        run.log_params({"model": str(model), "dataset": str(dataset) if dataset else None,
                        "split": split if dataset else None,
                        "input": str(input) if input else None, "batch_size": batch_size,
                        "compile": compile, "out": str(result.out)})
        run.log_metrics({"rows": result.rows, "seconds": result.seconds,
                         "rows_per_s": result.rows_per_s})
    console.print(f"scored {result.rows:,} rows in {result.seconds:.2f} s "
                  f"({result.rows_per_s:,.0f} rows/s) -> {result.out}"
                  + ("" if result.has_labels else " (scores only: the input has no labels)"),
                  markup=False)


def register(app: typer.Typer) -> None:
    app.command("predict")(predict_command)
