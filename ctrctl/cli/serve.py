"""``ctrctl serve``: the online ranker over an export folder or a registered model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def serve_command(
    model: Annotated[str, typer.Argument(
        help="Export folder, models:/NAME@ALIAS or models:/NAME/VERSION; a recommendation "
             "bundle (ctrctl quantize --index --ranker) also answers POST /v1/recommend.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    workers: Annotated[int | None, typer.Option(
        help="Server processes (default: one per two cores).")] = None,
    threads: Annotated[int | None, typer.Option(
        help="Torch threads per worker (default: the cores a worker has, less one for its "
             "event loop).")] = None,
    max_batch_rows: Annotated[int, typer.Option(help="Rows per model call at most.")] = 4096,
    max_wait_ms: Annotated[float, typer.Option(
        help="How long a request waits for others to batch with.")] = 2.0,
    timeout_ms: Annotated[float, typer.Option(
        help="A request's deadline: one that cannot meet it gets a 503 at once.")] = 1000.0,
    max_rows_per_request: Annotated[int, typer.Option(
        help="More rows (or candidates) in one request are a 413.")] = 4096,
    max_queue_rows: Annotated[int, typer.Option(
        help="Rows queued per model at most; beyond, requests get a 503.")] = 32768,
    log_dir: Annotated[Path | None, typer.Option(
        help="Request log folder (rotating Parquet files of the scored rows).")] = None,
    canary: Annotated[str | None, typer.Option(
        help="A second model (folder or models:/ URI) that scores --canary-percent of the "
             "requests, split by request id.")] = None,
    canary_percent: Annotated[float, typer.Option(
        help="Share of requests for --canary, 0-100.")] = 0.0,
    poll_s: Annotated[float, typer.Option(
        help="How often an alias URI is resolved again (0: never).")] = 30.0,
    tracking_uri: Annotated[str | None, typer.Option(
        help="MLflow store of models:/ URIs (default: MLFLOW_TRACKING_URI).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(
        help="Where registry models are downloaded (default ~/.cache/ctrctl/models).")] = None,
    verify: Annotated[Path | None, typer.Option(
        "--verify", help="Key file: serve only models signed with it "
        "(`ctrctl quantize --sign`).")] = None,
) -> None:
    """Serve click probabilities over HTTP: /v1/score, /v1/rank, /metrics (docs/serving.md)."""
    from ctrctl.cli.common import console
    from ctrctl.serving import ServeConfig, serve
    from ctrctl.serving.config import default_workers
    from ctrctl.serving.recommend import recommend_config

    config = ServeConfig(
        **recommend_config(model, tracking_uri),
        host=host, port=port, workers=workers or default_workers(), threads=threads,
        max_batch_rows=max_batch_rows, max_wait_ms=max_wait_ms, timeout_ms=timeout_ms,
        max_rows_per_request=max_rows_per_request, max_queue_rows=max_queue_rows,
        log_dir=str(log_dir) if log_dir else None, canary=canary,
        canary_percent=canary_percent, poll_s=poll_s, tracking_uri=tracking_uri,
        cache_dir=str(cache_dir) if cache_dir else None,
        verify_key=str(verify) if verify else None)
    serve(config, announce=lambda line: console.print(line, highlight=False))


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)
