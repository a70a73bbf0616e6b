"""The ``ctrctl`` command: one typer app, one module per subcommand.

Each module in :data:`COMMANDS` defines ``register(app)``. A library error becomes one clean
line on stderr and a non-zero exit; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

from ctrctl.errors import CtrctlError

#: Subcommand modules under ctrctl/cli/, in the order of the pipeline.
COMMANDS: tuple[str, ...] = ("synth", "preprocess", "plan", "train", "eval", "quantize",
                             "predict")

app = typer.Typer(
    name="ctrctl",
    help="Click-through-rate pipelines: raw logs to a sharded, trained and evaluated model.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_state = {"verbose": False}


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Debug logging and full tracebacks.")
    ] = False,
) -> None:
    from ctrctl.cli.common import setup_logging

    _state["verbose"] = verbose
    setup_logging(verbose)


for _name in COMMANDS:
    importlib.import_module(f"ctrctl.cli.{_name}").register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    from ctrctl.cli.common import console

    try:
        app(args=argv, prog_name="ctrctl", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except CtrctlError as exc:
        if _state["verbose"]:
            console.print_exception()
        console.print(f"[bold red]error:[/] {exc.render()}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]")
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
