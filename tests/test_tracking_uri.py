"""A tracking URI that cannot work fails in seconds, in one line, before any work starts."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ctrctl.errors import TrackingError
from ctrctl.tracking import check_tracking_uri


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Slow(http.server.BaseHTTPRequestHandler):
    delay = 30.0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        time.sleep(self.delay)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Broken(_Slow):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(503)
        self.end_headers()


def _serve(handler: type) -> tuple[http.server.HTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_down_server_is_one_error_naming_the_uri() -> None:
    uri = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(TrackingError) as info:
        check_tracking_uri(uri)
    assert uri in info.value.render() and "--no-track" in info.value.render()


def test_slow_server_times_out() -> None:
    server, uri = _serve(_Slow)
    try:
        start = time.monotonic()
        with pytest.raises(TrackingError, match="does not answer"):
            check_tracking_uri(uri, timeout_s=1.0)
        assert time.monotonic() - start < 10
    finally:
        server.shutdown()


def test_failing_server_is_refused() -> None:
    server, uri = _serve(_Broken)
    try:
        with pytest.raises(TrackingError, match="HTTP 503"):
            check_tracking_uri(uri)
    finally:
        server.shutdown()


@pytest.mark.parametrize("uri", ["ftp://example/x", "s3x://bucket"])
def test_unknown_scheme(uri: str) -> None:
    with pytest.raises(TrackingError, match="unknown tracking URI scheme"):
        check_tracking_uri(uri)


@pytest.mark.parametrize("uri", [None, "", "sqlite:///x.db", "file:///tmp/mlruns", "mlruns",
                                 "postgresql+psycopg2://u@h/db", "databricks"])
def test_local_stores_pass(uri: str | None) -> None:
    check_tracking_uri(uri)


@pytest.mark.parametrize("kind", ["down", "slow", "scheme"])
def test_cli_fails_in_seconds_with_one_line(tmp_path: Path, kind: str) -> None:
    server = None
    if kind == "down":
        uri = f"http://127.0.0.1:{_closed_port()}"
    elif kind == "slow":
        server, uri = _serve(_Slow)
    else:
        uri = "ftp://nowhere"
    out = tmp_path / "s"
    try:
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "ctrctl", "synth", "--rows", "1000", "--out", str(out),
             "--tracking-uri", uri],
            capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if server is not None:
            server.shutdown()
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed < 15
    assert not out.exists()
