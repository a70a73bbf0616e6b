"""``ctrctl serve``: check the model, then run the app under uvicorn (one or more workers).

The model is resolved and its files checked against the manifest here, before any worker
starts, so a tampered, truncated or missing file stops the command with one line naming
it. One worker runs in this process; several are uvicorn's worker processes, each loading
the model itself (the tables are read from the same files) with ``cores / workers`` torch
threads, their metrics summed through prometheus-client's multiprocess files.

SIGTERM (or Ctrl-C): uvicorn stops accepting connections and lets in-flight requests
finish; then the batchers score what they queued, the request log is flushed, and the
process exits 0.

Example:
    >>> serve(ServeConfig(model="export", port=8080, workers=2))
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from ctrctl.inference import standalone
from ctrctl.inference.export import signing_key
from ctrctl.modules import native
from ctrctl.serving.config import ENV, ServeConfig
from ctrctl.serving.source import ModelSource

logger = logging.getLogger(__name__)


def check_models(config: ServeConfig) -> list[str]:
    """Resolve and verify every model of ``config`` (downloading registry models once).

    Returns:
        One line per model: role, name, version, folder.

    Raises:
        ArtifactError: a file differs from its manifest (named).
        ConfigError, TrackingError: a bad MODEL or a registry that cannot be read.
    """
    cache = Path(config.cache_dir) if config.cache_dir else None
    lines = []
    for role, uri in (("primary", config.model), ("canary", config.canary)):
        if uri is None:
            continue
        bundle = role == "primary" and config.bundle is not None
        resolved = ModelSource.parse(uri, config.tracking_uri, cache, bundle=bundle).resolve()
        if config.verify_key is not None:
            standalone.verify(str(resolved.folder),
                              verify_key=signing_key(config.verify_key))
        lines.append(f"{role}: {resolved.name} version {resolved.version} ({resolved.folder})")
    return lines


def _draining_server_class() -> type:
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, but a SIGTERM it drained for is a clean exit (0): uvicorn
        raises the signal again once shut down, which kills the process with it."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                self._captured_signals = [s for s in self._captured_signals
                                          if s != signal.SIGTERM]

    return DrainingServer


def serve(config: ServeConfig, announce: Callable[[str], None] | None = None) -> None:
    """Serve until SIGTERM or Ctrl-C (see the module docstring).

    Args:
        config: the settings.
        announce: told what is served and where, once the models are checked (the CLI
            prints it; the log otherwise).
    """
    import uvicorn

    say = announce or logger.info
    for line in check_models(config):
        say(f"serving {line}")
    native.log_report(logger)
    say(f"on http://{config.host}:{config.port} ({config.workers} worker(s)); "
        "ready when /readyz answers 200")
    options = {"host": config.host, "port": config.port, "log_level": "warning",
               "timeout_graceful_shutdown": 30, "access_log": False}
    if config.workers == 1:
        from ctrctl.serving.app import create_app

        server_class = _draining_server_class()

        server = server_class(uvicorn.Config(create_app(config), **options))  # type: ignore[arg-type]
        server.run()
        return
    metrics_dir = tempfile.mkdtemp(prefix="ctrctl-serve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    os.environ[ENV] = config.to_json()
    try:
        uvicorn.run("ctrctl.serving.app:app_from_env", factory=True,
                    workers=config.workers, **options)  # type: ignore[arg-type]
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
