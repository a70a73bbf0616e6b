"""Scores from a serving artifact (``ctrctl predict``).

(A trained checkpoint scores a split with :func:`ctrctl.models.scoring.predict_split`, what
``ctrctl eval`` uses.) A serving artifact (``ctrctl quantize`` output) scores a preprocessed split
whose transforms are the model's (:func:`predict_dataset`) or raw logs, which go through
the same transforms first (:func:`predict_raw`); scores are written with labels as a
predictions Parquet file (``label``, ``score``) that ``ctrctl eval --predictions`` reads
(raw logs without a label column: ``score`` only).

Example:
    >>> predict_dataset("export", "dataset", "test", "scores.parquet").rows_per_s
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ctrctl.data.batch import Batch
from ctrctl.data.dataset import BatchLoader
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import DatasetError, OutputExistsError
from ctrctl.inference.batch_scoring import ScoresWriter, score_raw
from ctrctl.io import refuse_output_over_inputs, remove_stale_temps, temp_path, writing

__all__ = ["PredictResult", "batch_inputs", "check_transforms", "predict_dataset",
           "predict_raw"]


# ---- serving artifacts ---------------------------------------------------------------------
@dataclass(frozen=True)
class PredictResult:
    """What :func:`predict_dataset` / :func:`predict_raw` wrote."""

    out: Path
    rows: int
    seconds: float
    has_labels: bool

    @property
    def rows_per_s(self) -> float:
        return self.rows / max(self.seconds, 1e-9)


def batch_inputs(batch: Batch, order: Sequence[str]
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A loader batch -> the serving program's (dense, ids, lengths) in feature ``order``."""
    keys = batch.sparse.keys()
    kjt = batch.sparse if list(keys) == list(order) else batch.sparse.permute(
        [keys.index(f) for f in order])
    return batch.dense, kjt.values(), kjt.lengths()


#: The entries of a manifest's ``transforms`` that make the model's inputs. The others say
#: how that dataset's splits were drawn and stored (split ratio and seed, a val carved from
#: train, bad-row handling, row groups, compression, exact or approximate cardinality), which
#: a dataset of new rows to score rightly has its own of.
FEATURE_TRANSFORMS = ("dense", "sparse", "vocab_dir")
#: The entries that make the ids of string features hashed into buckets (polars' string
#: hash may change between versions): compared only for a model that has such features.
STRING_HASH_TRANSFORMS = ("polars_version", "string_hash_seed")


def hashes_strings(manifest: DatasetManifest) -> bool:
    """Whether some sparse feature of the dataset is a string hashed into buckets."""
    kinds = {c.get("name"): c.get("type") for c in manifest.schema.get("columns", [])}
    return any(f.mode == "hash" and kinds.get(f.name) == "string" for f in manifest.sparse)


def check_transforms(model_manifest: dict[str, Any], dataset: DatasetManifest,
                     where: str) -> None:
    """Raise :class:`DatasetError` naming the first transform where the dataset differs.

    Args:
        model_manifest: the training dataset's manifest as the artifact recorded it.
        dataset: the dataset to score.
        where: the dataset folder, for the message.
    """
    trained = DatasetManifest.from_dict(model_manifest, where="export/dataset/manifest.json")
    if trained.content_hash() == dataset.content_hash():
        return
    if trained.dense_names != dataset.dense_names:
        raise DatasetError(f"dense features differ: the model takes {trained.dense_names}, "
                           f"the dataset has {dataset.dense_names}", where=where,
                           hint="preprocess with --reuse-transforms of the model's dataset")
    if trained.sparse_names != dataset.sparse_names:
        raise DatasetError(f"sparse features differ: the model takes {trained.sparse_names}, "
                           f"the dataset has {dataset.sparse_names}", where=where,
                           hint="preprocess with --reuse-transforms of the model's dataset")
    ours = {c.get("name"): c for c in dataset.schema.get("columns", [])}
    for column in trained.schema.get("columns", []):
        other = ours.get(column.get("name"), {})
        for key in ("type", "transform", "fill", "clip", "hash_size", "min_count",
                    "multi_hot_separator"):
            if column.get(key) != other.get(key):
                raise DatasetError(
                    f"feature {column.get('name')!r}: transform {key} is "
                    f"{other.get(key)!r} in the dataset but {column.get(key)!r} in the model's",
                    where=where, hint="preprocess with --reuse-transforms of the model's "
                    "dataset")
    for a, b in zip(trained.sparse, dataset.sparse, strict=True):
        if (a.mode, a.num_embeddings, a.hash_size) != (b.mode, b.num_embeddings, b.hash_size):
            raise DatasetError(
                f"feature {a.name!r}: ids are {b.mode} with {b.num_embeddings} rows in the "
                f"dataset but {a.mode} with {a.num_embeddings} rows in the model's",
                where=where, hint="preprocess with --reuse-transforms of the model's dataset")
    compared = FEATURE_TRANSFORMS + (STRING_HASH_TRANSFORMS if hashes_strings(trained) else ())
    differ = [k for k in compared if dataset.transforms.get(k) != trained.transforms.get(k)]
    if differ:
        raise DatasetError(f"the dataset's transforms differ from the model's: {differ}",
                           where=where,
                           hint="preprocess with --reuse-transforms of the model's dataset")
    followed = dataset.follows or {}
    if followed.get("manifest_hash") not in (None, trained.content_hash()) or (
            not followed and any(f.mode == "vocab" for f in trained.sparse)):
        raise DatasetError("the dataset's vocabularies are not the model's (it was not "
                           "preprocessed with the model's transforms)", where=where,
                           hint="preprocess with --reuse-transforms of the model's dataset")


def predict_dataset(model_dir: str | Path, dataset: str | Path, split: str,
                    out: str | Path, *, batch_size: int = 8192, overwrite: bool = False,
                    num_workers: int = 1, compile: bool = False,
                    verify_key: str | Path | bytes | None = None) -> PredictResult:
    """Score a preprocessed split with a serving artifact; write label + score Parquet.

    ``compile`` compiles the program with TorchInductor first (``serving.load``'s
    ``compile``: several seconds, then faster batches; the program as exported, with a
    warning, where it cannot compile). ``verify_key`` (a key file's path, or the key)
    requires the artifact's signature (``ctrctl quantize --sign``). The split streams
    through the loader (row groups read by ``num_workers`` background workers) in
    ``batch_size`` rows, and the scores are appended to a Parquet file staged beside
    ``out`` (:class:`~ctrctl.inference.batch_scoring.ScoresWriter`): memory is a few
    batches, whatever the split's size.

    Raises:
        DatasetError: the dataset's transforms are not the model's (names the transform).
        OutputExistsError: ``out`` exists and ``overwrite`` is False.
    """
    from ctrctl.inference.export import load_artifact

    out = Path(out)
    refuse_output_over_inputs(out, [Path(model_dir), Path(dataset)])
    if out.exists() and not overwrite:
        raise OutputExistsError("the scores file already exists", where=str(out),
                                hint="pass --overwrite to replace it")
    # Verifies every file's hash (and the signature, with a key) first.
    serving = load_artifact(model_dir, compile=compile, verify_key=verify_key)
    recorded = Path(model_dir) / "dataset" / "manifest.json"
    manifest = DatasetManifest.load(dataset)
    if recorded.is_file():
        check_transforms(json.loads(recorded.read_text()), manifest, str(dataset))
    order = serving.contract["order"]
    started = time.perf_counter()
    rows = 0
    loader = BatchLoader.for_scoring(dataset, split, batch_size, num_workers=num_workers)
    with writing(out), ScoresWriter(out, overwrite=overwrite) as writer:
        for batch in loader.epoch(0):
            writer.write(batch.labels.numpy(),
                         serving.score(*batch_inputs(batch, order)).numpy())
            rows += batch.batch_size
    return PredictResult(out, rows, time.perf_counter() - started, True)


def predict_raw(model_dir: str | Path, raw: str | Path, out: str | Path, *,
                batch_size: int = 8192, overwrite: bool = False,
                on_bad_rows: str = "error", compile: bool = False,
                verify_key: str | Path | bytes | None = None,
                via: str = "preprocess") -> PredictResult:
    """Score raw logs with the model's schema, vocabularies and hash sizes.

    Both ways stream, in bounded memory, and give the same ids:

    - ``via="preprocess"`` (the command's): the logs are preprocessed with the model's
      transforms (``--reuse-transforms``: polars, and the native TSV reader where it
      applies) into a temporary dataset beside ``out``, whose row groups are then scored
      (:func:`predict_dataset`); ``on_bad_rows`` as preprocess takes it. The faster on a
      file: the preprocess step parses on every core.
    - ``via="encoder"``: the preprocess step's reader in ``batch_size`` chunks and the
      artifact's column encoder, as a server encodes a request
      (:func:`ctrctl.inference.batch_scoring.score_raw`); no temporary dataset; a bad row
      stops it, naming file, line and column (``on_bad_rows`` must be ``error``).

    Logs without the label column (serving logs, as Criteo's unlabeled test.txt: 39 fields,
    not 40; a header without the label's name;
    :func:`ctrctl.data.readers.has_label_column`) score through the encoder, whichever
    ``via``, into a scores file with no ``label`` column (``has_labels`` False).

    ``verify_key`` requires the artifact's signature, checked before its transforms are
    read.
    """
    from ctrctl.inference import standalone
    from ctrctl.inference.export import load_artifact, signing_key

    out = Path(out)
    refuse_output_over_inputs(out, [Path(model_dir), Path(raw)])
    if out.exists() and not overwrite:
        raise OutputExistsError("the scores file already exists", where=str(out),
                                hint="pass --overwrite to replace it")
    # The folder's transforms are read below, before the model loads: check it first.
    standalone.verify(str(model_dir), verify_key=signing_key(verify_key)
                      if verify_key is not None else None)
    transforms = Path(model_dir) / "dataset"
    if not (transforms / "manifest.json").is_file():
        raise DatasetError("the artifact records no dataset transforms", where=str(model_dir),
                           hint="score a preprocessed split with --dataset instead")
    started = time.perf_counter()
    recorded = DatasetManifest.load(transforms)
    labeled = _has_labels(recorded, Path(raw))
    if via == "encoder" or not labeled:
        from ctrctl.data.schema import Schema

        if not recorded.schema.get("columns"):
            raise DatasetError("the encoder path needs the model's schema",
                               where=str(model_dir), hint="use via='preprocess'"
                               if labeled else "score a preprocessed split with --dataset")
        if on_bad_rows != "error":
            raise DatasetError("the encoder path stops at a bad row" if labeled else
                               "logs without labels score row by row and stop at a bad row",
                               where=str(raw), hint="use via='preprocess'" if labeled else
                               "score with on_bad_rows='error'")
        serving = load_artifact(model_dir, compile=compile, verify_key=verify_key)
        with writing(out), ScoresWriter(out, overwrite=overwrite, labels=labeled) as writer:
            rows = score_raw(serving, Schema.from_dict(recorded.schema), Path(raw),
                             batch_size, writer, labeled=labeled)
        return PredictResult(out, rows, time.perf_counter() - started, labeled)
    from ctrctl.data.preprocess import preprocess

    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out.parent)
    scratch = temp_path(out)  # io's temp name: a killed run's is removed by the next one
    scratch.mkdir()
    try:
        # the raw logs are preprocessed beside ``out``: a full disk there is ``out``'s
        with writing(out):
            staged = scratch / "dataset"
            preprocess(None, [f"test={raw}"], staged, reuse_transforms=transforms,
                       on_bad_rows=on_bad_rows)  # type: ignore[arg-type]
            result = predict_dataset(model_dir, staged, "test", out, batch_size=batch_size,
                                     overwrite=overwrite, compile=compile,
                                     verify_key=verify_key)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return PredictResult(out, result.rows, time.perf_counter() - started, True)


def _has_labels(recorded: DatasetManifest, raw: Path) -> bool:
    """Whether the raw logs hold the model's label column (True without a recorded schema)."""
    from ctrctl.data.readers import has_label_column
    from ctrctl.data.schema import Schema

    if not recorded.schema.get("columns"):
        return True
    return has_label_column(Schema.from_dict(recorded.schema), raw)
