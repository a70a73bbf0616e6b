"""Take the documentation's screenshots: `ctrctl run`'s live view and the MLflow run page.

1. Runs ``ctrctl run pipelines/demo.yaml`` (what ``make demo`` runs) inside a tmux session of a
   fixed size, reads the pane with its colours while the train step runs and once more at
   the end, and saves both frames as SVG through rich (``docs/img/run-live.svg``,
   ``docs/img/run-summary.svg``).
2. Starts ``mlflow ui`` on 127.0.0.1 (a free port) over that run's store, and has headless
   Chromium (Debian's ``chromium``; ``apt-get install chromium``) take the eval step's run
   page with its reliability plot open (``docs/img/mlflow-eval-run.png``).

Not part of CI: it needs tmux and Chromium, and takes a minute or two.

Usage:
    python scripts/screenshots.py [--out docs/img] [--rows N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SESSION = "ctrctl-screenshots"
WIDTH, HEIGHT = 112, 30


def _env() -> dict[str, str]:
    """This Python's bin first on PATH and this checkout importable, as the tests run it."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _save_svg(ansi: str, path: Path, title: str) -> None:
    """An ANSI terminal frame as an SVG image, drawn by rich."""
    from rich.console import Console
    from rich.text import Text

    console = Console(record=True, width=WIDTH, force_terminal=True, file=open(os.devnull, "w"))
    console.print(Text.from_ansi(ansi.rstrip("\n")))
    path.parent.mkdir(parents=True, exist_ok=True)
    console.save_svg(str(path), title=title)


def capture_run_view(workdir: Path, out: Path, rows: int | None, timeout_s: float = 900) -> None:
    """Run the demo pipeline in tmux; keep a frame while training and the final one."""
    for name in ("schemas", "pipelines"):
        (workdir / name).symlink_to(REPO / name, target_is_directory=True)
    rows_override = f" synth.rows={rows}" if rows else ""
    command = (f"ctrctl run pipelines/demo.yaml{rows_override} --workdir demo; "
               "echo __done__; sleep 600")
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    subprocess.run(["tmux", "new-session", "-d", "-s", SESSION, "-x", str(WIDTH), "-y",
                    str(HEIGHT), "-c", str(workdir), command], check=True, env=_env())
    live: str | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            frame = subprocess.run(["tmux", "capture-pane", "-p", "-e", "-t", SESSION],
                                   capture_output=True, text=True, check=True).stdout
            if "__done__" in frame:
                final = frame.split("__done__")[0]
                break
            if live is None and "running" in frame and "epoch=1" in frame:
                live = frame  # the train step's progress bar, into its second epoch
            time.sleep(0.5)
        else:
            raise SystemExit(f"ctrctl run did not finish within {timeout_s:.0f} s")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    if live is not None:
        _save_svg(_last_view(live), out / "run-live.svg", "ctrctl run pipelines/demo.yaml (running)")
    _save_svg(_last_view(final), out / "run-summary.svg", "ctrctl run pipelines/demo.yaml (done)")


def _last_view(frame: str) -> str:
    """The frame from the last drawing of the run's table (log lines above it dropped)."""
    lines = frame.splitlines()
    starts = [i for i, line in enumerate(lines) if "ctrctl run " in line and "(" in line]
    return "\n".join(lines[starts[-1]:]) if starts else frame


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _eval_run(store: str) -> tuple[str, str]:
    """(experiment id, run id) of the latest eval step's run in the store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    for experiment in client.search_experiments():
        runs = client.search_runs([experiment.experiment_id], order_by=["start_time DESC"])
        for run in runs:
            if run.info.run_name and "eval" in run.info.run_name:
                return experiment.experiment_id, run.info.run_id
    raise SystemExit(f"no eval run in {store}")


def capture_mlflow_page(workdir: Path, out: Path, chromium: str) -> None:
    """The eval run's page in the MLflow UI, its reliability plot open, as a PNG."""
    store = f"sqlite:///{workdir / 'mlflow.db'}"
    experiment_id, run_id = _eval_run(store)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--host",
         "127.0.0.1", "--port", str(port)], cwd=workdir, env=_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(120):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(1)
        url = (f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs/{run_id}"
               "/artifacts/reliability.png")
        target = out / "mlflow-eval-run.png"
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                            f"--user-data-dir={profile}", "--hide-scrollbars",
                            "--window-size=1400,1000", "--virtual-time-budget=20000",
                            f"--screenshot={target}", url],
                           check=True, capture_output=True, timeout=180)
    finally:
        _stop(server)


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the MLflow server and the workers it started (its own process group)."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            return
        try:
            server.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    parser.add_argument("--rows", type=int, default=None,
                        help="synthetic rows of the demo (default: the demo's own, 60,000)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    for tool, found in (("tmux", shutil.which("tmux")), ("chromium", chromium)):
        if not found:
            print(f"{tool} is missing (apt-get install {tool})", file=sys.stderr)
            return 1
    assert chromium is not None
    with tempfile.TemporaryDirectory(prefix="ctrctl-screens-") as tmp:
        workdir = Path(tmp)
        capture_run_view(workdir, args.out, args.rows)
        capture_mlflow_page(workdir, args.out, chromium)
    print(f"screenshots in {args.out}: {sorted(p.name for p in args.out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
