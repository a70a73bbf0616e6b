"""The ``ctrctl`` command: one typer app, one module per subcommand.

Each module in :data:`COMMANDS` defines ``register(app)``. A library error becomes one clean
line on stderr and a non-zero exit; ``--verbose`` adds the traceback.

Exit codes: 0 success; 1 a ctrctl error (bad input, missing file, failed worker, ...);
2 a usage error (unknown option or command, a value of the wrong type); 3 an evaluation gate
failed (the model was evaluated, but is not good enough); 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

from ctrctl.errors import CtrctlError

#: Subcommand modules under ctrctl/cli/, in the order of the pipeline.
COMMANDS: tuple[str, ...] = ("synth", "preprocess", "plan", "train", "tune", "index", "eval",
                             "quantize", "predict", "serve", "loadtest", "monitor", "run", "config",
                             "tracking")

#: The environment variables a user may set, as ``ctrctl --help`` lists them.
ENVIRONMENT: tuple[tuple[str, str], ...] = (
    ("MLFLOW_TRACKING_URI", "the MLflow store or server (as --tracking-uri)"),
    ("MLFLOW_EXPERIMENT_NAME", "the MLflow experiment (as --experiment)"),
    ("CTRCTL_DIST_TIMEOUT_S", "seconds a collective of several processes waits for its peers "
     "before failing (default 300)"),
    ("CTRCTL_JOIN_TIMEOUT_S", "seconds the nodes of a multi-node run wait for each other to "
     "join (default 600)"),
    ("CTRCTL_PREPROCESS_ENGINE", "polars: preprocess without the native fast path"),
    ("CTRCTL_TRACKING_MODE", "background (default) or sync: whether synth, preprocess, plan, "
     "eval and predict send their MLflow run from a detached process after they exit"),
)

app = typer.Typer(
    name="ctrctl",
    help="Click-through-rate pipelines: raw logs to a sharded, trained and evaluated model.",
    epilog="Environment: " + "; ".join(f"{name}: {text}" for name, text in ENVIRONMENT) + ".",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from ctrctl.compat import ctrctl_version

        typer.echo(f"ctrctl {ctrctl_version()}")
        raise typer.Exit()

_state = {"verbose": False}


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Debug logging and full tracebacks.")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True,
                           help="Print the version and exit.")
    ] = False,
) -> None:
    from ctrctl.cli.common import setup_logging

    _state["verbose"] = verbose
    setup_logging(verbose)


for _name in COMMANDS:
    importlib.import_module(f"ctrctl.cli.{_name}").register(app)


#: Options of the ``ctrctl`` command itself that are also accepted after a subcommand.
GLOBAL_FLAGS = ("--verbose", "-v")


def hoist_global_flags(argv: list[str]) -> list[str]:
    """``ctrctl synth --verbose ...`` as ``ctrctl --verbose synth ...``: the global flags
    are taken wherever they appear before a ``--``, and put in front of the subcommand."""
    end = argv.index("--") if "--" in argv else len(argv)
    flags = [a for a in argv[:end] if a in GLOBAL_FLAGS]
    rest = [a for a in argv[:end] if a not in GLOBAL_FLAGS]
    return [*dict.fromkeys(flags), *rest, *argv[end:]]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    from ctrctl.cli.common import console, print_error

    args = hoist_global_flags(list(sys.argv[1:] if argv is None else argv))
    try:
        app(args=args, prog_name="ctrctl", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except CtrctlError as exc:
        if _state["verbose"]:
            console.print_exception()
        print_error(exc.render())
        from ctrctl.distributed.launch import report_worker_error

        report_worker_error(exc.render(), type(exc).__name__)  # a rank under `launch`: tell it
        return exc.exit_code
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]")
        return 130
    except Exception as exc:
        # The serving artifact's loader runs without ctrctl, so its errors are its own class
        # (imported only once an artifact was read: the CLI starts without torch).
        loader = sys.modules.get("ctrctl.inference.standalone")
        if loader is None or not isinstance(exc, loader.ArtifactError):
            raise
        if _state["verbose"]:
            console.print_exception()
        print_error(f"{exc} (pass a folder `ctrctl quantize --out` wrote, unchanged since)")
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
