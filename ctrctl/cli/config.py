"""``ctrctl config show``: the resolved pipeline config (defaults + file + overrides) as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

config_app = typer.Typer(help="Pipeline configs: show the resolved settings.",
                         no_args_is_help=True)


@config_app.command("show")
def show_command(
    overrides: Annotated[list[str] | None, typer.Argument(
        help="Overrides such as training.batch_size=1024.", show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Pipeline YAML (default: the built-in defaults).")] = None,
    tracking_uri: Annotated[str | None, typer.Option(
        "--tracking-uri", envvar="MLFLOW_TRACKING_URI",
        help="Accepted as by every command; showing a config logs no MLflow run.")] = None,
    no_track: Annotated[bool, typer.Option(
        "--no-track", help="Accepted as by every command (nothing is tracked here anyway).")
    ] = False,
) -> None:
    """Print the config `ctrctl train` would use, every key resolved, as YAML.

    Sizes left at null (batch_size, epochs, val_every) are chosen from the dataset when
    training starts; the train log prints what was chosen.
    """
    from ctrctl.config import defaults_path, dump_config, load_config

    cfg = load_config(config, overrides or [])
    typer.echo(f"# {config or defaults_path()}"
               + (f" + {' '.join(overrides)}" if overrides else ""))
    typer.echo(dump_config(cfg), nl=False)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
