"""``ctrctl tracking flush``: send the journals that background tracking left waiting."""

from __future__ import annotations

from pathlib import Path

import typer

from ctrctl.cli.common import TrackingUri, console

tracking_app = typer.Typer(help="Background tracking: send waiting journals to MLflow.",
                           no_args_is_help=True)


@tracking_app.command("flush")
def flush_command(tracking_uri: TrackingUri = None) -> None:
    """Send every journal waiting for the tracking store, here and now.

    Commands such as synth, preprocess, plan, eval and predict track in the background:
    their runs are written to a journal in a spool folder beside the store
    (.ctrctl/spool/ for sqlite, ~/.cache/ctrctl/spool/ for a server) and sent by a detached
    process. A journal that could not be sent (the server was down) waits there; this sends
    it and says what is left. Exit code 1 when something could not be sent.
    """
    from ctrctl.errors import TrackingError
    from ctrctl.tracking.replay import FAILED_DIR, flush
    from ctrctl.tracking.uri import spool_folder

    spool = spool_folder(tracking_uri, Path.cwd())
    report = flush(spool)
    console.print(f"{len(report.sent)} journals sent from {spool}", markup=False)
    if report.busy:
        console.print(f"{len(report.busy)} journals are being sent by another process",
                      markup=False)
    if report.kept:
        raise TrackingError(f"{len(report.kept)} journals kept: the store did not answer "
                            f"({report.error})", where=tracking_uri or str(spool),
                            hint="start the tracking server, then run ctrctl tracking flush")
    if report.failed:
        raise TrackingError(f"{len(report.failed)} journals refused by MLflow "
                            f"({report.error}): moved to {spool / FAILED_DIR}",
                            where=str(spool), hint="read the .error file beside each")


def register(app: typer.Typer) -> None:
    app.add_typer(tracking_app, name="tracking")
