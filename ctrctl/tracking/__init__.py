"""Experiment tracking: one MLflow run per pipeline step, or nothing.

With no tracking URI configured, MLflow's own default store is used (sqlite ``mlflow.db``
in the working folder, artifacts under ``mlruns/``). ``--tracking-uri`` or
``MLFLOW_TRACKING_URI`` point at a server; ``--no-track`` gives a :class:`NoopTracker`.
Nothing here touches MLflow until a run starts. ``make_tracker(..., mode="background")`` gives
a tracker that never imports MLflow in this process: its runs are journals, sent by a
detached replayer (:mod:`ctrctl.tracking.journal`, :mod:`ctrctl.tracking.replay`).

Example:
    >>> tracker = make_tracker(enabled=True, tracking_uri=None, experiment="ctrctl")
    >>> with tracker.run("preprocess") as run:
    ...     run.log_params({"schema": "criteo"})
    ...     run.log_metrics({"rows": 8000})
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ctrctl.errors import TrackingError
from ctrctl.tracking.uri import _TRACKING_HINT
from ctrctl.tracking.uri import LOCAL_SCHEMES as LOCAL_SCHEMES
from ctrctl.tracking.uri import PROBE_TIMEOUT_S as PROBE_TIMEOUT_S
from ctrctl.tracking.uri import SERVER_SCHEMES as SERVER_SCHEMES
from ctrctl.tracking.uri import check_tracking_uri as check_tracking_uri

logger = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "ctrctl"
#: MLflow's HTTP client retries a dead server with backoff for minutes by default; a run
#: that loses its server fails within about this many tries instead (a user's env wins).
_HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                      "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                      "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
#: MLflow's switch for its artifact download/upload progress bars.
ARTIFACT_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
#: A parent run (``ctrctl run``) passes its id to child steps, which become nested runs.
PARENT_RUN_ENV = "CTRCTL_PARENT_RUN_ID"
#: Hex digits of a dataset's sha256 kept in MLflow's digest field (its column holds 36).
DIGEST_CHARS = 32
#: MLflow 3's UI opens an experiment by this tag: ``custom_model_development`` shows the
#: training runs (metrics, params, models) rather than the GenAI traces overview.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def mlflow_key(name: str) -> str:
    """A metric or tag name as MLflow accepts it: ``@`` (``recall@100``, which MLflow
    refuses) becomes ``_at_`` (``recall_at_100``); other names pass unchanged."""
    return name.replace("@", "_at_")


class Run:
    """What a step logs to; the no-op base class logs nothing."""

    run_id: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log parameters; nested mappings are flattened to ``a.b`` keys."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log numeric metrics, optionally at a step."""

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Log a file or a folder as an artifact."""

    def log_dict(self, obj: Any, name: str) -> None:
        """Log a JSON-serialisable object as ``name`` (a .json file name)."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set tags on the run."""

    def log_dataset(self, dataset: DatasetRef, context: str) -> None:
        """Log a dataset the run read or wrote (``context``: ``train``, ``output`` ...)."""


@dataclasses.dataclass(frozen=True)
class DatasetRef:
    """A dataset as the runs record it: our own digest, where it is, what it holds.

    Attributes:
        name: e.g. ``demo/train``.
        sha256: sha256 over the dataset's files (see ``ctrctl.runner.hashing``); MLflow's
            dataset table holds at most 36 characters of digest, so the entity's digest is
            its first 32 hex digits and the full value is in the profile (``sha256``).
        source: the folder (a path or URI).
        schema: column name -> type.
        profile: small facts (rows, files).
    """

    name: str
    sha256: str
    source: str
    schema: Mapping[str, str]
    profile: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def digest(self) -> str:
        """The digest MLflow stores: the sha256's first DIGEST_CHARS hex digits."""
        return self.sha256[:DIGEST_CHARS]


class Tracker:
    """Starts runs; this base class is the no-op tracker."""

    enabled = False

    #: (step name, run id) of every run this tracker started, in order.
    started: list[tuple[str, str]]

    def __init__(self) -> None:
        self.started = []

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, str] | None = None) -> Iterator[Run]:
        yield Run()

    def child(self, parent_run_id: str | None) -> Tracker:
        """A tracker whose runs are nested under ``parent_run_id`` (the no-op stays no-op)."""
        return Tracker()

    def open(self, run_id: str | None) -> Run:
        """A handle to log more into an existing run (e.g. a finished step's)."""
        return Run()

    def find_runs(self, parent_run_id: str, step: str) -> list[str]:
        """Ids of the runs of ``step`` nested under ``parent_run_id``, newest first."""
        return []

    def register_model(self, name: str, model_uri: str, run_id: str | None,
                       tags: Mapping[str, str], alias: str | None) -> str | None:
        """Register ``model_uri`` as a new version of ``name``; returns the version.

        ``alias`` (when given) is moved to the new version; None leaves every alias as is.
        """
        return None


NoopTracker = Tracker


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the tracking server could not be reached (not that it refused
    what was sent): MLflow wraps connection errors and timeouts as "API request to ...
    failed"."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, OSError):
        return True
    return isinstance(exc, MlflowException) and str(exc).startswith("API request to ")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class MlflowRun(Run):
    """Logs into one MLflow run.

    Its first metric batches are sent synchronously; a run that goes on logging (training)
    sends the rest asynchronously (MLflow's own queue), awaited by :meth:`flush`, which the
    tracker calls before it ends the run. (Ending a run stops MLflow's queue, which takes up
    to a second: a short command never starts it.)

    A server that stops answering mid-run does not stop the work: one warning names it, and
    what the run logs from then on is kept in order and sent when the run ends
    (:meth:`flush`), or reported as not sent.
    """

    #: Metric batches sent synchronously before a run's later ones go asynchronously.
    SYNC_BATCHES = 8

    def __init__(self, client: Any, run_id: str, where: str = "the tracking store"):
        self._client = client
        self.run_id = run_id
        self.where = where
        #: Calls kept since the server was lost (None while it answers).
        self.pending: list[Callable[[], Any]] | None = None
        self._sent_async: list[Any] = []
        self._last_ms = 0
        self._batches = 0

    def _timestamp(self) -> int:
        """Milliseconds, strictly increasing within the run: of two values logged at one
        step, MLflow's latest-metric (the runs list) keeps the later timestamp, so a value
        logged after another at the same step must not tie with it."""
        import time

        self._last_ms = max(int(time.time() * 1000), self._last_ms + 1)
        return self._last_ms

    def _lost(self, exc: BaseException, call: Callable[[], Any]) -> None:
        self.pending = [call]
        logger.warning("tracking server %s stopped answering (%s): the work goes on; what "
                       "run %s logs is kept and sent when it ends", self.where,
                       _first_line(exc), self.run_id)

    def _send(self, call: Callable[[], Any]) -> None:
        if self.pending is not None:
            self.pending.append(call)
            return
        try:
            call()
        except Exception as exc:
            if not unreachable(exc):
                raise
            self._lost(exc, call)

    def flush(self) -> bool:
        """Wait for the batches sent asynchronously, then send what was kept while the
        server was lost; False (with a warning) if it still does not answer."""
        sent, self._sent_async = self._sent_async, []
        for operation in sent:
            try:
                operation.wait()
            except Exception as exc:
                if not unreachable(exc):
                    raise
                if self.pending is None:
                    self._lost(exc, lambda: None)
        pending, self.pending = self.pending or [], None
        for done, call in enumerate(pending):
            try:
                call()
            except Exception as exc:
                if not unreachable(exc):
                    raise
                logger.warning("tracking server %s still does not answer (%s): %d logging "
                               "calls of run %s were not sent", self.where, _first_line(exc),
                               len(pending) - done, self.run_id)
                self.pending = pending[done:]
                return False
        return True

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        flat = _flatten(params)
        batch = [Param(k, str(v)[:6000]) for k, v in flat.items()]
        for start in range(0, len(batch), 100):
            part = batch[start : start + 100]
            self._send(functools.partial(self._client.log_batch, self.run_id, params=part))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = self._timestamp()
        batch = [
            Metric(mlflow_key(k), float(v), now, step or 0)
            for k, v in _flatten(metrics).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        for start in range(0, len(batch), 500):
            part = batch[start : start + 500]
            self._batches += 1
            if self.pending is not None or self._batches <= self.SYNC_BATCHES:
                self._send(functools.partial(self._client.log_batch, self.run_id, metrics=part))
                continue
            try:
                operation = self._client.log_batch(self.run_id, metrics=part,
                                                   synchronous=False)
            except Exception as exc:
                if not unreachable(exc):
                    raise
                self._lost(exc, functools.partial(self._client.log_batch, self.run_id,
                                                  metrics=part))
                continue
            if operation is not None:
                self._sent_async.append(operation)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._send(lambda: self._client.log_artifacts(self.run_id, str(path), artifact_path))
        else:
            self._send(lambda: self._client.log_artifact(self.run_id, str(path), artifact_path))

    def log_dict(self, obj: Any, name: str) -> None:
        text = json.dumps(obj, indent=2, sort_keys=True, default=str)

        def send() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                target = Path(tmp) / name
                target.write_text(text)
                self._client.log_artifact(self.run_id, str(target))

        self._send(send)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self._send(functools.partial(self._client.set_tag, self.run_id, mlflow_key(key),
                                         str(value)))

    def log_dataset(self, dataset: DatasetRef, context: str) -> None:
        entity = dataset_input(dataset, context)
        self._send(lambda: self._client.log_inputs(self.run_id, datasets=[entity]))


def dataset_input(dataset: DatasetRef, context: str) -> Any:
    """MLflow's ``DatasetInput`` for ``dataset`` read or written as ``context``."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    entity = Dataset(
        name=dataset.name, digest=dataset.digest, source_type="local",
        source=json.dumps({"uri": dataset.source}),
        schema=json.dumps({"mlflow_colspec": [
            {"name": k, "type": v} for k, v in dataset.schema.items()]}),
        profile=json.dumps({"sha256": dataset.sha256, **dataset.profile}, default=str))
    return DatasetInput(dataset=entity, tags=[InputTag("mlflow.data.context", context)])


class _SyncRun(MlflowRun):
    """A handle on a run this process did not start: nothing flushes it later."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        self.flush()


class MlflowTracker(Tracker):
    """Tracks to MLflow through its client API (no global active-run state).

    Args:
        tracking_uri: a server or store URI; None means ``MLFLOW_TRACKING_URI`` or MLflow's
            default (sqlite ``mlflow.db`` in the working folder).
        experiment: experiment name, created when missing.
    """

    enabled = True

    def __init__(self, tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT,
                 parent_run_id: str | None = None):
        super().__init__()
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.parent_run_id = parent_run_id
        # Opened once, on first use: importing MLflow and opening a store take seconds.
        self._opened: Any = None
        self._experiment_id: str | None = None

    def child(self, parent_run_id: str | None) -> Tracker:
        child = MlflowTracker(self.tracking_uri, self.experiment, parent_run_id)
        child.started = self.started
        child._opened, child._experiment_id = self._opened, self._experiment_id
        return child

    def open(self, run_id: str | None) -> Run:
        """A handle on an existing run; metrics logged to it are sent synchronously."""
        return _SyncRun(self._client(), run_id, self._where()) if run_id else Run()

    def find_runs(self, parent_run_id: str, step: str) -> list[str]:
        client = self._client()
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None:
            return []
        runs = client.search_runs(
            [experiment.experiment_id],
            filter_string=(f"tags.`mlflow.parentRunId` = '{parent_run_id}' "
                           f"and tags.`ctrctl.step` = '{step}'"),
            order_by=["attributes.start_time DESC"])
        return [r.info.run_id for r in runs]

    def _logged_model_id(self, client: Any, model_uri: str, run_id: str | None) -> str | None:
        """The id of the model logged as ``runs:/RUN/NAME``: MLflow 3 keeps a
        logged model outside the run's artifacts, so a version made from the runs:/ URI
        itself would point at files that are not there."""
        if not model_uri.startswith("runs:/") or run_id is None:
            return None
        artifact = model_uri.removeprefix(f"runs:/{run_id}/").strip("/")
        search = getattr(client, "search_logged_models", None)
        if search is None:  # MLflow 2: the model is in the run's artifacts
            return None
        experiment = client.get_run(run_id).info.experiment_id
        found = [m for m in search(experiment_ids=[experiment],
                                   filter_string=f"source_run_id = '{run_id}'")
                 if m.name == artifact]
        return str(found[0].model_id) if found else None

    def register_model(self, name: str, model_uri: str, run_id: str | None,
                       tags: Mapping[str, str], alias: str | None) -> str | None:
        from mlflow.exceptions import MlflowException

        client = self._client()
        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(name)
        model_id = self._logged_model_id(client, model_uri, run_id)
        source = f"models:/{model_id}" if model_id else model_uri
        if self.tracking_uri and source.startswith("models:/"):
            # The registry resolves a models:/ source through the global tracking URI.
            import mlflow

            mlflow.set_tracking_uri(self.tracking_uri)
        # A tracking server accepts a models:/<id> source only with its model_id beside it.
        version = client.create_model_version(name, source, run_id=run_id,
                                              tags={mlflow_key(k): str(v)
                                                    for k, v in tags.items()},
                                              **({"model_id": model_id} if model_id else {}))
        if alias:
            client.set_registered_model_alias(name, alias, version.version)
        return str(version.version)

    def _client(self) -> Any:
        if self._opened is None:
            from mlflow.tracking import MlflowClient

            self._opened = MlflowClient(tracking_uri=self.tracking_uri)
        return self._opened

    def _experiment(self, client: Any) -> str:
        """The experiment's id (created when missing), tagged as model training."""
        if self._experiment_id is not None:
            return self._experiment_id
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None:
            self._experiment_id = str(client.create_experiment(
                self.experiment, artifact_location=self._artifact_location(),
                tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}))
        else:
            self._experiment_id = str(experiment.experiment_id)
            if EXPERIMENT_KIND_TAG not in experiment.tags:  # a kind the user set stays
                client.set_experiment_tag(self._experiment_id, EXPERIMENT_KIND_TAG,
                                          EXPERIMENT_KIND)
        return self._experiment_id

    def _artifact_location(self) -> str | None:
        """Beside an explicit sqlite store (``<its folder>/mlruns/<experiment>``), so the store
        and its artifacts travel together; MLflow's default (./mlruns) otherwise."""
        uri = self.tracking_uri or ""
        if not uri.startswith("sqlite:///"):
            return None
        database = Path(uri.removeprefix("sqlite:///")).resolve()
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.experiment)
        return (database.parent / "mlruns" / safe).as_uri()

    def _where(self) -> str:
        return (self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                or "the default store (sqlite mlflow.db)")

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, str] | None = None) -> Iterator[Run]:
        from mlflow.exceptions import MlflowException

        client = self._client()
        run_tags = {**_context_tags(), "mlflow.runName": name, "ctrctl.step": name,
                    **(tags or {})}
        parent = self.parent_run_id or os.environ.get(PARENT_RUN_ENV)
        if parent:
            run_tags["mlflow.parentRunId"] = parent
        try:
            experiment_id = self._experiment(client)
            mlrun = client.create_run(experiment_id, tags=run_tags, run_name=name)
        except (MlflowException, OSError) as exc:  # one line, not MLflow's chained traces
            raise TrackingError(f"cannot start the {name} run: {_first_line(exc)}",
                                where=self._where(), hint=_TRACKING_HINT) from exc
        run = MlflowRun(client, mlrun.info.run_id, self._where())
        self.started.append((name, mlrun.info.run_id))
        status = "FAILED"
        try:
            yield run
            status = "FINISHED"
        finally:
            # A server lost mid-run got the rest kept: one more try now, then a warning.
            if run.pending is None or run.flush():
                run._send(lambda: client.set_terminated(run.run_id, status=status))
                if run.pending:
                    logger.warning("run %s stays open on %s (its end was not sent)",
                                   run.run_id, self._where())


@functools.cache
def git_commit() -> str | None:
    """The commit of the ctrctl checkout that runs (None outside a git checkout)."""
    import subprocess

    try:
        answer = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (answer.stdout.strip() or None) if answer.returncode == 0 else None


_GIT_COMMIT_TAG = "mlflow.source.git.commit"


def _context_tags() -> dict[str, str]:
    """MLflow's context tags (user, source name and type), as its fluent API adds them;
    ``MlflowClient.create_run`` alone does not. The git commit is the ctrctl package's
    checkout's, from one ``git rev-parse`` per process: MLflow's own git context imports
    GitPython (most of a second) and looks at the entry script, which for the ``ctrctl``
    console script is outside the checkout."""
    tags: dict[str, str] = {}
    try:
        from mlflow.tracking.context.git_context import GitRunContext
        from mlflow.tracking.context.registry import resolve_tags

        # (``ignore`` takes provider classes: it tests isinstance, whatever its hint says)
        ignore: Any = [GitRunContext]
        tags = {k: str(v) for k, v in resolve_tags(ignore=ignore).items()}
    except Exception as exc:  # a context provider failing must not stop a run
        logger.debug("no MLflow context tags: %s", exc)
    if _GIT_COMMIT_TAG not in tags:
        commit = git_commit()
        if commit:
            tags[_GIT_COMMIT_TAG] = commit
    return tags


#: How a tracker sends what runs log: ``sync`` (MLflow, in this process) or ``background``
#: (a journal replayed by a detached process: :mod:`ctrctl.tracking.journal`).
MODE_ENV = "CTRCTL_TRACKING_MODE"
MODES = ("sync", "background")


def make_tracker(
    enabled: bool = True,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    check: bool = True,
    mode: str = "sync",
) -> Tracker:
    """The tracker a command uses: MLflow unless tracking is turned off.

    Args:
        enabled: False gives the no-op tracker.
        tracking_uri: an explicit URI; None means ``MLFLOW_TRACKING_URI`` or MLflow's default.
        experiment: the experiment name.
        check: probe the URI now (:func:`check_tracking_uri`), so a dead server fails in
            seconds instead of after MLflow's minutes of retries. In background mode only the
            scheme is checked: the journal waits for a server that is away.
        mode: ``sync`` or ``background`` (:class:`~ctrctl.tracking.journal.JournalTracker`:
            runs have no MLflow id until they are replayed).
    """
    if mode not in MODES:
        raise TrackingError(f"unknown tracking mode {mode!r}", where=MODE_ENV,
                            hint=f"use one of {', '.join(MODES)}")
    if not enabled:
        return Tracker()
    for key, value in _HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not sys.stderr.isatty():
        # MLflow's download bar redrawn into a pipe is one line of dozens of bars.
        os.environ.setdefault(ARTIFACT_BAR_ENV, "false")
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if check:
        check_tracking_uri(uri, probe=mode == "sync")
    if mode == "background":
        from ctrctl.tracking.journal import JournalTracker

        return JournalTracker(tracking_uri=uri, experiment=experiment)
    return MlflowTracker(tracking_uri=tracking_uri, experiment=experiment)
