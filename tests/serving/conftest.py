"""A small raw-row model shared by the serving tests: synthetic Criteo logs, preprocessed with
hash (C1-C3) and vocabulary (the rest) features and log1p dense ones, one short training run,
INT8 tables, exported."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.data.synthetic import synthesize
from ctrctl.inference.export import write_artifact
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train

ROOT = Path(__file__).resolve().parents[2]

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=128", "training.epochs=1", "training.num_workers=1",
    "training.device=cpu", "training.checkpoint_every=0", "training.val_every=0",
]


@dataclass(frozen=True)
class Exported:
    export: Path
    dataset: Path
    raw: Path  # the raw test logs (TSV, Criteo columns)
    names: list[str]  # the raw columns, label first

    def records(self, rows: int | None = None) -> list[dict[str, Any]]:
        """Raw test rows as the server takes them (label dropped, empty fields absent)."""
        out = []
        with open(self.raw, newline="") as handle:
            for row in csv.reader(handle, delimiter="\t"):
                record = {n: v for n, v in zip(self.names, row, strict=True)
                          if n != "label" and v != ""}
                out.append(record)
                if rows is not None and len(out) == rows:
                    break
        return out


def build_export(root: Path, seed: int = 1, epochs: int = 1) -> Exported:
    schema = yaml.safe_load((ROOT / "schemas" / "criteo_vocab.yaml").read_text())
    for column in schema["columns"]:
        if column.get("name") in ("C1", "C2", "C3"):
            column.pop("min_count", None)
            column["hash_size"] = 500
    (root / "schema.yaml").write_text(yaml.safe_dump(schema))
    logs = root / "logs"
    synthesize(logs, rows=2500, format="criteo", seed=seed,
               splits={"train": 0.8, "test": 0.2})
    dataset = root / "ds"
    preprocess(root / "schema.yaml", [f"train={logs / 'train.tsv'}",
                                      f"test={logs / 'test.tsv'}"], dataset, val_fraction=0.1)
    with torch_threads(1):
        run = train(dataset, root / "run",
                    load_config(None, [*OVERRIDES, f"training.epochs={epochs}"]))
        export = write_artifact(quantize_checkpoint(run.checkpoint,
                                                    QuantizeConfig(dtype="int8")),
                                root / "export", dataset=dataset)
    names = [c["name"] for c in schema["columns"]]
    return Exported(export, dataset, logs / "test.tsv", names)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return build_export(tmp_path_factory.mktemp("serving-model"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None,
             timeout: float = 30.0) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(status, JSON body, headers); ``body`` bytes are sent as they are."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={
            "Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read()), dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read()), dict(exc.headers)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self, timeout: float = 60.0) -> tuple[int, str]:
        """SIGTERM; (exit code, output)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        output, _ = self.process.communicate(timeout=timeout)
        return int(self.process.returncode), output


def start_server(model: str | Path, *args: str, env: dict[str, str] | None = None,
                 ready_s: float = 120.0) -> Server:
    """``ctrctl serve MODEL ARGS`` on a free port; returns once /readyz answers 200."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ctrctl", "serve", str(model), "--port", str(port),
         "--workers", "1", *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", process)
    # Each worker answers /readyz for itself and the kernel spreads connections over them:
    # with several, ready means many answers in a row (a worker still loading answers 503).
    workers = int(args[args.index("--workers") + 1]) if "--workers" in args else 1
    needed, in_a_row = (1 if workers == 1 else 10 * workers), 0
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited {process.returncode}: "
                                 f"{process.communicate()[0]}")
        try:
            in_a_row = in_a_row + 1 if server.get("/readyz")[0] == 200 else 0
        except OSError:
            in_a_row = 0
        if in_a_row >= needed:
            return server
        time.sleep(0.2 if in_a_row == 0 else 0.01)
    server.stop()
    raise AssertionError("the server did not become ready")


@contextlib.contextmanager
def running(model: str | Path, *args: str, env: dict[str, str] | None = None
            ) -> Iterator[Server]:
    server = start_server(model, *args, env=env)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.stop()
