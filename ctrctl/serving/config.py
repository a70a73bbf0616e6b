"""The settings of ``ctrctl serve``: one frozen dataclass, passed to every worker as JSON."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from ctrctl.errors import ConfigError

ENV = "CTRCTL_SERVE_CONFIG"


def default_workers() -> int:
    """One worker per two cores (each worker's compute thread plus its torch threads), >= 1."""
    return max(1, (os.cpu_count() or 1) // 2)


@dataclass(frozen=True)
class ServeConfig:
    """Args:
        model: an export folder, ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.
        host, port: where to listen.
        workers: server processes.
        max_batch_rows: rows per model call at most.
        max_wait_ms: how long a request waits for others to batch with.
        timeout_ms: a request's deadline; one that cannot meet it is refused (503).
        max_rows_per_request: more rows are a 413.
        max_queue_rows: rows queued per model at most; beyond, 503.
        log_dir: the request log's folder (None: no log).
        canary, canary_percent: a second model and the share of requests it scores.
        poll_s: how often an alias URI is resolved again (0: never).
        tracking_uri: the MLflow store of ``models:/`` URIs.
        cache_dir: where registry models are downloaded (None: ~/.cache/ctrctl/models).
        threads: torch threads per worker (None: cores / workers - 1, at least 1).
        verify_key: a key file: every model served must carry a signature made with it
            (``ctrctl quantize --sign``); None: no signature needed.
        bundle: ``model`` again when it names a recommendation bundle (a folder or a
            registered bundle): its ranker is served and POST /v1/recommend added
            (:mod:`ctrctl.serving.recommend`); None: ``model`` is an export.
    """

    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    max_batch_rows: int = 4096
    max_wait_ms: float = 2.0
    timeout_ms: float = 1000.0
    max_rows_per_request: int = 4096
    max_queue_rows: int = 32768
    log_dir: str | None = None
    canary: str | None = None
    canary_percent: float = 0.0
    poll_s: float = 30.0
    tracking_uri: str | None = None
    cache_dir: str | None = None
    threads: int | None = None
    verify_key: str | None = None
    bundle: str | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.workers >= 1, "--workers must be at least 1"),
            (self.max_batch_rows >= 1, "--max-batch-rows must be at least 1"),
            (self.max_wait_ms >= 0, "--max-wait-ms must not be negative"),
            (self.timeout_ms > 0, "--timeout-ms must be positive"),
            (self.max_rows_per_request >= 1, "--max-rows-per-request must be at least 1"),
            (self.max_queue_rows >= self.max_rows_per_request,
             "the queue must hold at least one request of --max-rows-per-request rows"),
            (0 <= self.canary_percent <= 100, "--canary-percent must be in [0, 100]"),
            (self.canary_percent == 0 or self.canary is not None,
             "--canary-percent needs --canary MODEL2"),
            (self.poll_s >= 0, "--poll-s must not be negative"),
            (0 < self.port < 65536, "--port must be in 1..65535"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message, where="ctrctl serve")

    def torch_threads(self) -> int:
        """``threads``, else the cores a worker has less one for its event loop (>= 1).

        On 2 cores (one worker) a 270-row call scored in 1.6 ms on one torch thread and in
        119-172 ms on two at load average 8-10 (``scripts/profile_serve.py``): a second
        torch thread competes with the event loop parsing the next request, and OpenMP's
        threads wait for each other when one of them is descheduled."""
        if self.threads:
            return self.threads
        return max(1, (os.cpu_count() or 1) // self.workers - 1)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        return cls(**json.loads(text))
