"""What ``ctrctl monitor`` reads: the model (with its reference statistics) and the rows.

MODEL is a training checkpoint (its reference comes from the training split it records), an
export folder (``dataset/reference_stats.json``, written by ``ctrctl quantize``) or a
registered ``models:/NAME@ALIAS`` / ``models:/NAME/N`` (its export, downloaded and verified).

Rows come from a dataset split (features as preprocessed, labels, the model's scores), or
from ``ctrctl serve``'s request log (raw features encoded by the export's own encoder, the
scores the server returned) joined with labels that arrived later.

Example:
    >>> model = resolve_model("export")
    >>> rows = rows_from_dataset(model, "data/day2", "test", segment_by="C1")
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from ctrctl import checkpoint as ckpt
from ctrctl.data.manifest import DatasetManifest
from ctrctl.data.reference import REFERENCE_FILE, read_split_columns, reference_stats
from ctrctl.errors import CheckpointError, ConfigError, DatasetError, FormatError
from ctrctl.inference import standalone
from ctrctl.monitoring.join import join_labels, read_request_log

__all__ = ["MonitoredModel", "Rows", "resolve_model", "rows_from_dataset", "rows_from_requests"]


@dataclass
class MonitoredModel:
    """A model under watch.

    Attributes:
        uri: as given.
        kind: ``checkpoint`` or ``export``.
        folder: the checkpoint's step folder or the export folder.
        reference: the training split's statistics (:mod:`ctrctl.data.reference`).
        name, version: the registered name and version (folder name and step/hash otherwise).
    """

    uri: str
    kind: str
    folder: Path
    reference: dict[str, Any]
    name: str
    version: str
    registered: bool = False

    def serving(self) -> Any:
        """The loaded export (verified)."""
        from ctrctl.inference.export import load_artifact

        return load_artifact(self.folder)


@dataclass
class Rows:
    """Rows to judge. ``dense``/``sparse``: per feature, values of every row (a multi-hot
    feature: every id); ``labels``, ``scores`` and ``segments``: of the labelled rows."""

    dense: dict[str, np.ndarray]
    sparse: dict[str, np.ndarray]
    all_scores: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    segments: np.ndarray | None = None
    missing: dict[str, float] = field(default_factory=dict)
    staleness_s: dict[str, float] = field(default_factory=dict)
    join: dict[str, Any] | None = None


def resolve_model(uri: str, tracking_uri: str | None = None) -> MonitoredModel:
    """The model ``uri`` names, with its reference statistics.

    Raises:
        ConfigError: no such model, or one that carries no reference statistics.
    """
    if uri.startswith("models:/"):
        from ctrctl.serving.source import ModelSource

        resolved = ModelSource.parse(uri, tracking_uri).resolve()
        model = _export(uri, resolved.folder)
        model.name, model.version, model.registered = resolved.name, resolved.version, True
        return model
    path = Path(uri)
    if (path / standalone.MANIFEST).is_file() and (path / "serving.py").is_file():
        return _export(uri, path)
    try:
        meta = ckpt.read_metadata(path)
    except (CheckpointError, FormatError):
        raise ConfigError(f"{uri}: not a checkpoint, an export folder or a models:/ URI",
                          where="--model") from None
    dataset = meta.extra.get("dataset")
    if not dataset or not (Path(dataset) / "manifest.json").is_file():
        raise ConfigError("the checkpoint's training dataset is gone: its statistics are "
                          "the reference", where=str(meta.path),
                          hint="monitor the model's export (ctrctl quantize), which carries them")
    return MonitoredModel(uri, "checkpoint", meta.path, _checkpoint_reference(meta.path,
                                                                              Path(dataset)),
                          path.resolve().name, f"step-{meta.step}")


def _checkpoint_reference(checkpoint: Path, dataset: Path) -> dict[str, Any]:
    """The training split's statistics with the checkpoint's scores on the same rows."""
    import torch

    from ctrctl.data.dataset import BatchLoader
    from ctrctl.data.reference import MAX_ROWS
    from ctrctl.models.scoring import load_model

    model, _, _ = load_model(checkpoint)
    loader = BatchLoader.for_scoring(dataset, "train", 8192, num_workers=1, max_rows=MAX_ROWS)
    with torch.no_grad():
        scores = [torch.sigmoid(model(b.dense, b.sparse).float()).numpy()
                  for b in loader.epoch(0)]
    return reference_stats(dataset, "train", max_rows=MAX_ROWS,
                           scores=np.concatenate(scores) if scores else None)


def _export(uri: str, folder: Path) -> MonitoredModel:
    file = folder / "dataset" / REFERENCE_FILE
    if not file.is_file():
        raise ConfigError("the export carries no reference statistics of its training split",
                          where=str(file), hint="export it again with ctrctl quantize from "
                          "a checkpoint whose training dataset still exists")
    version = standalone.sha256_file(str(folder / standalone.MANIFEST))[:12]
    return MonitoredModel(uri, "export", folder, json.loads(file.read_text()),
                          folder.resolve().name, f"local-{version}")


def _scores(model: MonitoredModel, dataset: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, scores) of a split in file order."""
    if model.kind == "checkpoint":
        from ctrctl.models.scoring import predict_split

        parts = list(predict_split(model.folder, dataset, split, num_workers=1))
    else:
        from ctrctl.data.dataset import BatchLoader
        from ctrctl.inference.predictor import batch_inputs

        serving = model.serving()
        order = serving.contract["order"]
        loader = BatchLoader.for_scoring(dataset, split, 8192, num_workers=1)
        parts = [(b.labels.numpy(), serving.score(*batch_inputs(b, order)).numpy())
                 for b in loader.epoch(0)]
    if not parts:
        return np.zeros(0, np.int8), np.zeros(0, np.float32)
    return (np.concatenate([p[0] for p in parts]).astype(np.int8),
            np.concatenate([p[1] for p in parts]).astype(np.float64))


def _age_s(created: str) -> float | None:
    try:
        stamp = _dt.datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=_dt.timezone.utc)
    return max(0.0, time.time() - stamp.timestamp())


def rows_from_dataset(model: MonitoredModel, dataset: str | Path, split: str,
                      segment_by: str | None = None) -> Rows:
    """A preprocessed split: its features, labels and the model's scores."""
    dataset = Path(dataset)
    manifest = DatasetManifest.load(dataset)
    names = [*manifest.dense_names, *manifest.sparse_names]
    if segment_by is not None and segment_by not in names:
        raise ConfigError(f"--segment-by {segment_by}: the dataset has no such feature",
                          hint=f"features: {', '.join(names[:12])}")
    values = read_split_columns(dataset, split, names, max_rows=None)
    labels, scores = _scores(model, dataset, split)
    segments = values[segment_by] if segment_by is not None else None
    if segments is not None and segments.size != labels.size:
        raise ConfigError(f"--segment-by {segment_by}: a multi-hot feature cannot segment rows")
    age = _age_s(manifest.created)
    return Rows({n: values[n] for n in manifest.dense_names},
                {n: values[n] for n in manifest.sparse_names}, scores, scores, labels,
                segments, staleness_s={"dataset": age} if age is not None else {})


def rows_from_requests(model: MonitoredModel, log_dir: str | Path, labels: str | Path,
                       segment_by: str | None = None) -> Rows:
    """Served rows (the request log) encoded by the export's encoder, joined with labels."""
    if model.kind != "export":
        raise ConfigError("--requests needs the served model: an export folder or models:/ "
                          "URI (its encoder reads the logged raw values)", where="--model")
    log = read_request_log(log_dir)
    try:
        label_table = pq.read_table(labels)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read the labels: {exc}", where=str(labels)) from None
    joined, counts = join_labels(log, label_table)
    serving = model.serving()
    columns = serving.input_columns()
    if segment_by is not None and segment_by not in log.column_names:
        raise ConfigError(f"--segment-by {segment_by}: the request log has no such column",
                          hint=f"columns: {', '.join(columns[:12])}")
    n = log.num_rows
    raw = {c: np.asarray(log.column(c).to_numpy(zero_copy_only=False), dtype=object)
           for c in columns if c in log.column_names}
    dense, ids, lengths = (t.numpy() for t in serving.encode_columns(raw, n))
    contract = serving.contract
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    sparse = {}
    for f, feature in enumerate(contract["sparse"]):
        sparse[feature["name"]] = ids[offsets[f * n]:offsets[(f + 1) * n]]
    dense_names = [d["name"] for d in contract["dense"]]
    missing = {c: float(log.column(c).null_count) / max(1, n) for c in columns
               if c in log.column_names}
    newest = log.column("time").to_numpy(zero_copy_only=False).max() if n else None
    staleness = {"labels": max(0.0, time.time() - Path(labels).stat().st_mtime)}
    if newest is not None:
        staleness["requests"] = max(0.0, time.time() - newest.astype("datetime64[us]")
                                    .astype(np.int64) / 1e6)
    segments = (np.asarray(joined.column(segment_by).to_numpy(zero_copy_only=False),
                           dtype=object) if segment_by is not None else None)
    return Rows({name: dense[:, i] for i, name in enumerate(dense_names)}, sparse,
                log.column("score").to_numpy(),
                joined.column("score").to_numpy().astype(np.float64),
                joined.column("label").to_numpy().astype(np.int8), segments, missing,
                staleness, counts)
