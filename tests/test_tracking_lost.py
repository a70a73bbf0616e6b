"""A tracking URI that is some other web server is one line (it was a 74-line MLflow
traceback); a server lost mid-train costs a warning, not the training (it was 251 lines and
no checkpoint)."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mlflow.exceptions import MlflowException

from ctrctl import checkpoint as ckpt
from ctrctl.cli.app import main
from ctrctl.config import load_config
from ctrctl.errors import TrackingError
from ctrctl.testing.datasets import make_dataset
from ctrctl.tracking import MlflowRun, MlflowTracker, check_tracking_uri
from ctrctl.training.loop import train
from tests.inference.conftest import OVERRIDES


class _Files(http.server.SimpleHTTPRequestHandler):
    """What ``python -m http.server`` answers: 404 for /health and every MLflow call."""

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_web_server_that_is_not_mlflow_is_one_line(web_server: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(TrackingError, match="not an MLflow tracking server"):
        check_tracking_uri(web_server)
    code = main(["synth", "--rows", "100", "--out", str(tmp_path / "logs"),
                 "--tracking-uri", web_server])
    assert code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {web_server}:"), err
    assert "HTTP 404" in lines[0] and "--no-track" in lines[0]


def test_a_run_that_cannot_start_is_one_error(web_server: str) -> None:
    # Past the probe (no check), MLflow's own 404 error becomes one TrackingError.
    with pytest.raises(TrackingError, match="cannot start the train run") as caught:
        with MlflowTracker(web_server).run("train"):
            pass
    assert caught.value.where == web_server


class _Client:
    """MLflow's client where the server stops answering after ``up_for`` log_batch calls
    (``back`` brings it back)."""

    def __init__(self, up_for: int) -> None:
        self.up_for = up_for
        self.sent: list[tuple[str, Any]] = []
        self.tries_while_down = 0
        self.back = False

    def _call(self, name: str, value: Any) -> None:
        down = not self.back and len([s for s in self.sent if s[0] == "log_batch"]) >= self.up_for
        if down:
            self.tries_while_down += 1
            raise MlflowException("API request to http://127.0.0.1:9/api/2.0/mlflow/runs/"
                                  "log-batch failed with exception ConnectionError(...)")
        self.sent.append((name, value))

    def get_experiment_by_name(self, name: str) -> Any:
        return SimpleNamespace(experiment_id="1", tags={})

    def set_experiment_tag(self, experiment_id: str, key: str, value: str) -> None:
        pass

    def create_run(self, experiment_id: str, **kwargs: Any) -> Any:
        return SimpleNamespace(info=SimpleNamespace(run_id="r1"))

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (),
                  synchronous: bool = True) -> None:
        self._call("log_batch", [m.key for m in metrics] or [p.key for p in params])

    def log_artifact(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        self._call("log_artifact", Path(path).name)

    def log_artifacts(self, run_id: str, path: str, artifact_path: str | None = None) -> None:
        self._call("log_artifacts", Path(path).name)

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self._call("set_tag", key)

    def log_inputs(self, run_id: str, datasets: Any) -> None:
        self._call("log_inputs", None)

    def set_terminated(self, run_id: str, status: str) -> None:
        self._call("set_terminated", status)


@pytest.mark.parametrize("comes_back", [False, True])
def test_a_server_lost_mid_train_keeps_the_training(comes_back: bool, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    ds = make_dataset(tmp_path / "ds", rows=512, num_sparse=3, seed=0)
    client = _Client(up_for=3)
    tracker = MlflowTracker("http://127.0.0.1:9")
    monkeypatch.setattr(tracker, "_client", lambda: client)
    config = load_config(None, [*OVERRIDES, "training.epochs=1", "training.log_every=2"])
    if comes_back:  # the server answers again before the run ends
        real_flush = MlflowRun.flush

        def flush(self: MlflowRun) -> bool:
            client.back = True
            return real_flush(self)

        monkeypatch.setattr(MlflowRun, "flush", flush)
    with caplog.at_level(logging.WARNING, logger="ctrctl"):
        result = train(ds.path, tmp_path / "run", config, tracker=tracker)
    assert ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints") == result.checkpoint
    assert (tmp_path / "run" / "metrics.json").is_file()
    lost = [r.getMessage() for r in caplog.records if "stopped answering" in r.getMessage()]
    assert len(lost) == 1 and "http://127.0.0.1:9" in lost[0]
    if comes_back:
        assert client.sent[-1] == ("set_terminated", "FINISHED")
        assert client.tries_while_down == 1  # kept, not retried call by call
        assert ("log_artifact", "metrics.json") in client.sent
    else:
        assert client.tries_while_down == 2  # the first loss, and one try at the end
        unsent = [r.getMessage() for r in caplog.records if "were not sent" in r.getMessage()]
        assert len(unsent) == 1 and "still does not answer" in unsent[0]
