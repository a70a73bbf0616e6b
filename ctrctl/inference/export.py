"""The serving artifact: a ``torch.export`` program, safetensors tables, plan, manifest, loader.

Layout and loading rules are in :mod:`ctrctl.inference.standalone` (copied into the artifact
as ``serving.py``). The program is exported non-strict with flat inputs (dense, ids,
lengths) and a dynamic batch; its weights are taken out before it is saved (the saved
program holds empty tensors in their place and no example inputs, so loading it unpickles
nothing) and written as one safetensors file per serving shard plus one for the dense
layers; the loader puts them back after checking every file's hash.

Example:
    >>> q = quantize_checkpoint("runs/a", QuantizeConfig(dtype="int4", num_shards=2))
    >>> write_artifact(q, "export")
    >>> serving = load_artifact("export")            # the standalone loader
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from ctrctl.data.manifest import DatasetManifest
from ctrctl.data.reference import MAX_ROWS as REFERENCE_ROWS
from ctrctl.data.reference import REFERENCE_FILE, reference_stats
from ctrctl.data.transforms import STRING_HASH_SEED
from ctrctl.errors import CheckpointError, ConfigError, DatasetError, OutputExistsError
from ctrctl.inference import standalone
from ctrctl.inference.quantize import QuantizedModel
from ctrctl.inference.sharded_dlrm import ShardedDLRM
from ctrctl.io import (
    file_sha256,
    json_sha256,
    refuse_output_over_inputs,
    staged_folder,
    tree_sha256,
    write_json_atomic,
    writing,
)
from ctrctl.modules import native

logger = logging.getLogger(__name__)

PROGRAM = "program.pt2"
#: the program's two stages (format 2): /v1/rank pools a context shared by every candidate
#: once, then broadcasts its pooled vectors into the dense stage
STAGE_FILES = {"sparse": "sparse.pt2", "dense": "dense.pt2"}
DENSE_FILE = "dense.safetensors"
PLAN_FILE = "serving_plan.json"
LOADER_FILE = "serving.py"
ENCODER_FILE = "serving_encoder.py"
TIMESTAMPS_FILE = "serving_timestamps.py"
PROGRAM_CHECKS_FILE = "serving_program.py"


def shard_file(shard: int) -> str:
    return f"tables/shard-{shard:05d}.safetensors"


def example_inputs(model: ShardedDLRM, batch: int = 3
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A small valid request: (dense, ids, lengths) with one id per feature and sample."""
    num_sparse = len(model.input_features)
    dense = torch.zeros(batch, model.num_dense_features)
    lengths = torch.ones(num_sparse * batch, dtype=torch.int64)
    return dense, torch.zeros(num_sparse * batch, dtype=torch.int64), lengths


def export_program(model: ShardedDLRM) -> torch.export.ExportedProgram:
    """``torch.export`` the serving model: non-strict, dynamic batch and id count.

    Raises:
        ConfigError: for a graph with functionalized mutations (none is expected).
    """
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    num_ids = torch.export.Dim("num_ids", min=0, max=1 << 40)
    num_sparse = len(model.input_features)
    shapes = {"dense": {0: batch}, "ids": {0: num_ids}, "lengths": {0: num_sparse * batch}}
    with torch.no_grad():
        program = torch.export.export(model, example_inputs(model), dynamic_shapes=shapes,
                                      strict=False)
    functionalized = [n.name for n in program.graph.nodes
                      if "auto_functionalized" in str(n.target)]
    if functionalized:
        raise ConfigError(f"the exported graph has functionalized mutations: {functionalized}",
                          where="export_program")
    return program


def export_stages(model: ShardedDLRM) -> dict[str, torch.export.ExportedProgram]:
    """The model's sparse stage ``(ids, lengths) -> pooled (B, F, D)`` and dense stage
    ``(dense, pooled) -> probabilities`` as programs of their own, over the same state
    names as :func:`export_program`'s (one set of weight files serves all three)."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    num_ids = torch.export.Dim("num_ids", min=0, max=1 << 40)
    num_sparse = len(model.input_features)
    dense, ids, lengths = example_inputs(model)
    with torch.no_grad():
        pooled = model.pool(ids, lengths)
    specs = {"sparse": (model.pool, (ids, lengths),
                        {"ids": {0: num_ids}, "lengths": {0: num_sparse * batch}}),
             "dense": (model.score_pooled, (dense, pooled),
                       {"dense": {0: batch}, "sparse": {0: batch}})}
    programs = {}
    for name, (method, args, shapes) in specs.items():
        model.forward = method  # type: ignore[method-assign,assignment]  # export traces it
        try:
            with torch.no_grad():
                programs[name] = torch.export.export(model, args, dynamic_shapes=shapes,
                                                     strict=False)
        finally:
            del model.forward
    return programs


def _stripped_copy(program: torch.export.ExportedProgram) -> dict[str, torch.Tensor]:
    """Take the weights out of ``program`` (empty tensors in their place); return them."""
    state = {}
    for name, value in list(program.state_dict.items()):
        state[name] = value.detach().contiguous().cpu()
        empty = torch.empty(0, dtype=value.dtype)
        program.state_dict[name] = (nn.Parameter(empty, requires_grad=False)
                                    if isinstance(value, nn.Parameter) else empty)
    program.example_inputs = None  # type: ignore[assignment]
    return state


def input_contract(manifest: DatasetManifest, order: list[str],
                   vocabularies: dict[str, str] | None = None) -> dict[str, Any]:
    """How raw rows become model inputs: the raw columns read, features, order, hash sizes
    or vocabularies, dense transforms and derived features (from the dataset's schema; a
    dataset without one takes ids as given).

    ``columns`` lists the raw columns a request may carry, in the schema's order (a
    timestamp column such as Avazu's ``hour`` in place of the features derived from it);
    ``ignored`` the schema's other columns (label, ``role: ignore``), accepted and unread.
    """
    schema_columns = [c for c in manifest.schema.get("columns", []) if isinstance(c, dict)]
    columns = {c.get("name"): c for c in schema_columns}
    derived = _derived_features(manifest.schema)
    dense = []
    for d in manifest.dense:
        column = columns.get(d.name, {})
        dense.append({"name": d.name, "type": column.get("type", "float"),
                      "transform": column.get("transform", "log1p" if column else "none"),
                      "fill": float(column.get("fill", 0.0)), "clip": column.get("clip")})
    by_name = {f.name: f for f in manifest.sparse}
    sparse = []
    for name in order:
        f = by_name[name]
        column = columns.get(name, {})
        mode = f.mode if column or name in derived else "id"
        entry: dict[str, Any] = {"name": name, "type": column.get("type", "id"), "mode": mode,
                                 "num_embeddings": f.num_embeddings,
                                 "hash_size": f.hash_size,
                                 "separator": column.get("multi_hot_separator")}
        if name in derived:
            entry["type"], entry["derive"] = "int", derived[name]
        if mode == "vocab":
            entry["vocabulary"] = (vocabularies or {}).get(name)
        if mode == "hash" and entry["type"] == "string":
            entry["probes"] = _string_probes(name, f.num_embeddings, manifest)
        sparse.append(entry)
    features = {d.name for d in manifest.dense} | set(order)
    sources = {d["column"] for d in derived.values()}
    if schema_columns:
        raw = [c["name"] for c in schema_columns
               if c.get("name") in features or c.get("name") in sources]
        ignored = [c["name"] for c in schema_columns if c["name"] not in raw]
    else:
        raw, ignored = [d.name for d in manifest.dense] + list(order), [manifest.label]
    contract: dict[str, Any] = {
        "columns": raw, "ignored": ignored,
        "dense": dense, "sparse": sparse, "order": list(order), "label": manifest.label,
        "layout": "dense (B, F_dense) float32; ids (N,) int64 feature after feature in "
                  "`order`; lengths (F * B,) int64 key-major; output (B,) probability"}
    if any("probes" in e for e in sparse):
        contract["string_hash"] = {
            "library": "polars", "function": "Series.hash(seed) % hash_size",
            "version": manifest.transforms.get("polars_version"),
            "seed": int(manifest.transforms.get("string_hash_seed", STRING_HASH_SEED))}
    return contract


def _derived_features(schema: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Derived feature -> {column, format, kind}, named as the preprocess step names them."""
    if not schema.get("columns"):
        return {}
    from ctrctl.data.schema import Schema

    parsed = Schema.from_dict(schema)
    return {name: {"column": column.name, "format": column.derive.format, "kind": kind}
            for column, name, kind in parsed.derived_features()
            if column.derive is not None}


#: Strings whose ids the artifact records for each string-hashed feature, so the standalone
#: loader can prove that its hash is the preprocess step's before it scores a raw row:
#: every length class of the hash (0, 1-3, 4-8, 9-16, 17-128, 129-240, longer), non-ASCII.
STRING_PROBES: tuple[str, ...] = (
    "", "a", "ab", "abc", "abcd", "abcdefgh", "0123456789", "0123456789abcdef",
    "the quick brown fox", "é漢字🙂", "x" * 100, "y" * 200, "z" * 300, "1e3", " a ")


def _string_probes(name: str, size: int, manifest: DatasetManifest) -> list[list[Any]] | None:
    """``[[probe, id], ...]``: the ids the preprocess step's own expression gives the probe
    strings, or None when this polars is not the one that hashed the training data (its
    hash may differ, so no probe would be trustworthy)."""
    import polars as pl

    from ctrctl.data.transforms import encode_hash

    trained_with = manifest.transforms.get("polars_version")
    if trained_with != pl.__version__:
        logger.warning("feature %r was hashed with polars %s, this is polars %s: the "
                       "artifact cannot hash raw strings for it", name, trained_with,
                       pl.__version__)
        return None
    frame = pl.DataFrame({name: list(STRING_PROBES)}, schema={name: pl.String})
    ids = frame.select(encode_hash(name, "string", size, False))[name].to_list()
    return [[probe, int(i)] for probe, i in zip(STRING_PROBES, ids, strict=True)]


def _vocabulary_files(manifest: DatasetManifest, dataset: Path | None, stage: Path
                      ) -> dict[str, str]:
    """Write each vocabulary-mode feature's key -> id map as JSON; returns name -> path."""
    wanted = [f.name for f in manifest.sparse if f.mode == "vocab"]
    if not wanted or dataset is None:
        return {}
    import polars as pl

    out = {}
    for name in wanted:
        source = dataset / "vocab" / f"{name}.parquet"
        if not source.is_file():
            continue
        frame = pl.read_parquet(source)
        mapping = {("null" if v is None else str(v)): int(i)
                   for v, i in zip(frame["value"].to_list(), frame["id"].to_list(),
                                   strict=True)}
        relative = f"vocab/{name}.json"
        (stage / "vocab").mkdir(exist_ok=True)
        (stage / relative).write_text(json.dumps(mapping))
        out[name] = relative
    return out


def write_artifact(quantized: QuantizedModel, out: str | Path, *, overwrite: bool = False,
                   dataset: str | Path | None = None,
                   sign_key: str | Path | bytes | None = None) -> Path:
    """Export, write and verify the serving artifact folder ``out`` atomically.

    Args:
        quantized: the quantized model (:func:`~ctrctl.inference.quantize.quantize_checkpoint`).
        out: the artifact folder.
        overwrite: replace an existing ``out``.
        dataset: the training dataset folder, for vocabulary-mode features' vocabularies.
        sign_key: sign the manifest with this key (a key file's path, or its bytes):
            ``manifest.sig``, which ``ctrctl predict --verify KEY`` requires.

    Raises:
        OutputExistsError: ``out`` exists and ``overwrite`` is False.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputExistsError("the export folder already exists", where=str(out),
                                hint="pass --overwrite to replace it")
    key = signing_key(sign_key) if sign_key is not None else None
    model = quantized.model
    program = export_program(model)
    stages = export_stages(model)
    state = _stripped_copy(program)
    stage_state = {name: sorted(_stripped_copy(stage)) for name, stage in stages.items()}
    # Staged beside ``out`` under io's temp name (a killed export's folder is cleaned up by
    # the next write there); an old artifact is replaced only once the new one is verified.
    with staged_folder(out, overwrite=overwrite) as stage:
        files: dict[str, dict[str, Any]] = {}
        groups: dict[str, dict[str, torch.Tensor]] = {DENSE_FILE: {}}
        for name, tensor in state.items():
            if name.startswith("shards."):
                shard = int(name.split(".")[1])
                groups.setdefault(shard_file(shard), {})[name] = tensor
            else:
                groups[DENSE_FILE][name] = tensor
        (stage / "tables").mkdir()
        for relative, tensors in groups.items():
            save_file(tensors, str(stage / relative), metadata={"file": relative})
            files[relative] = {"tensors": sorted(tensors)}
        torch.export.save(program, str(stage / PROGRAM))
        files[PROGRAM] = {}
        for name, stage_program in stages.items():
            torch.export.save(stage_program, str(stage / STAGE_FILES[name]))
            files[STAGE_FILES[name]] = {}
        quantized.plan.save(stage / PLAN_FILE)
        files[PLAN_FILE] = {}
        shutil.copyfile(standalone.__file__, stage / LOADER_FILE)
        files[LOADER_FILE] = {}
        for module, target in (("standalone_encoder.py", ENCODER_FILE),
                               ("standalone_timestamps.py", TIMESTAMPS_FILE),
                               ("standalone_program.py", PROGRAM_CHECKS_FILE)):
            shutil.copyfile(Path(standalone.__file__).with_name(module), stage / target)
            files[target] = {}
        manifest = quantized.manifest
        vocabularies = (_vocabulary_files(manifest, Path(dataset) if dataset else None, stage)
                        if manifest is not None else {})
        for relative in vocabularies.values():
            files[relative] = {}
        if manifest is not None:
            # The training dataset's manifest (and vocabularies): what `ctrctl predict`
            # checks a dataset against and preprocesses raw logs with.
            manifest.save(stage / "dataset")
            files["dataset/manifest.json"] = {}
            for name in manifest.sparse_names:
                source = Path(dataset) / "vocab" / f"{name}.parquet" if dataset else None
                if source is not None and source.is_file():
                    (stage / "dataset" / "vocab").mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, stage / "dataset" / "vocab" / f"{name}.parquet")
                    files[f"dataset/vocab/{name}.parquet"] = {}
            if _write_reference(Path(dataset) if dataset else None, stage / "dataset",
                                model):
                files[f"dataset/{REFERENCE_FILE}"] = {}
        for relative, entry in files.items():
            entry["sha256"] = file_sha256(stage / relative)
            entry["bytes"] = (stage / relative).stat().st_size
        write_json_atomic(stage / standalone.MANIFEST,
                          {**_manifest(quantized, program, state, files, vocabularies),
                           "stages": {name: {"file": STAGE_FILES[name], "state": names}
                                      for name, names in stage_state.items()}})
        if key is not None:
            standalone.sign(str(stage), key)
        standalone.verify(str(stage), verify_key=key)
        readable_by_others(stage)
    logger.info("serving artifact written: %s", out)
    return out


def _write_reference(dataset: Path | None, folder: Path, model: ShardedDLRM) -> bool:
    """The training split's statistics, with the exported model's scores on the same rows
    (what ``ctrctl monitor`` measures drift against)."""
    from ctrctl.data.dataset import BatchLoader
    from ctrctl.inference.predictor import batch_inputs

    if dataset is None or not (dataset / "manifest.json").is_file():
        return False
    try:
        loader = BatchLoader.for_scoring(dataset, "train", 8192, num_workers=1,
                                         max_rows=REFERENCE_ROWS)
        with torch.no_grad():
            scores = [model(*batch_inputs(b, model.input_features)).numpy()
                      for b in loader.epoch(0)]
        stats = reference_stats(dataset, "train", max_rows=REFERENCE_ROWS,
                                scores=np.concatenate(scores) if scores else None)
    except (DatasetError, OSError) as exc:
        logger.warning("no reference statistics in the export: %s", exc)
        return False
    write_json_atomic(folder / REFERENCE_FILE, stats)
    return True


def signing_key(key: str | Path | bytes) -> bytes:
    """The bytes of a signing key (``key`` itself, or its file's).

    Raises:
        ConfigError: the key file cannot be read, or holds fewer than 16 bytes.
    """
    try:
        return standalone.read_key(key if isinstance(key, bytes) else str(key))
    except standalone.ArtifactError as exc:
        raise ConfigError(str(exc), where="--sign/--verify",
                          hint="give a file of at least 16 random bytes") from None


def readable_by_others(folder: Path) -> None:
    """Give ``folder`` (a temporary folder: mode 0700) and everything in it the modes a new
    file gets under the umask (0755 / 0644 under 022), so a serving account can read it."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _manifest(quantized: QuantizedModel, program: torch.export.ExportedProgram,
              state: dict[str, torch.Tensor], files: dict[str, dict[str, Any]],
              vocabularies: dict[str, str]) -> dict[str, Any]:
    from ctrctl.compat import versions

    model = quantized.model
    manifest = quantized.manifest
    needs_fbgemm = any("fbgemm" in str(n.target) for n in program.graph.nodes)
    hashes: dict[str, Any] = {"serving_plan": files[PLAN_FILE]["sha256"]}
    if quantized.checkpoint is not None:
        from ctrctl import checkpoint as ckpt

        meta = ckpt.read_metadata(quantized.checkpoint)
        hashes["checkpoint"] = tree_sha256(quantized.checkpoint)
        hashes["training_plan"] = json_sha256(meta.plan) if meta.plan else None
    if manifest is not None:
        hashes["dataset_manifest"] = manifest.content_hash()
        hashes["schema"] = manifest.schema_hash or None
    return {
        "format": standalone.FORMAT,
        "format_version": standalone.FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "files": files,
        "hashes": hashes,
        "checkpoint": str(quantized.checkpoint) if quantized.checkpoint else None,
        "training_run_id": quantized.training_run_id,
        "quantization": quantized.config.to_dict(),
        "tables": quantized.table_report,
        "program": {
            "file": PROGRAM, "needs_fbgemm": needs_fbgemm,
            "inputs": ["dense", "ids", "lengths"], "output": "probability (B,) float32",
            "state": {name: {"shape": list(t.shape), "dtype": str(t.dtype)}
                      for name, t in state.items()},
        },
        "input": (input_contract(manifest, model.input_features, vocabularies)
                  if manifest is not None else {
                      "dense": [{"name": f"dense_{i}", "transform": "none"}
                                for i in range(model.num_dense_features)],
                      "sparse": [{"name": f, "type": "id", "mode": "id",
                                  "num_embeddings": spec.num_embeddings}
                                 for shard in model.shards
                                 for spec in shard.tables  # type: ignore[union-attr]
                                 for f in spec.feature_names],
                      "order": model.input_features}),
    }


def load_artifact(folder: str | Path, device: str = "cpu", compile: bool = False,
                  verify_key: str | Path | bytes | None = None) -> Any:
    """Verify and load an artifact with its standalone loader (a ``serving.ServingModel``;
    ``compile`` and ``verify_key``: see :func:`ctrctl.inference.standalone.load`)."""
    key = signing_key(verify_key) if verify_key is not None else None
    return standalone.load(str(folder), device=device, compile=compile, verify_key=key)


@contextmanager
def _still_there(step: Path) -> Iterator[None]:
    """A run still training deletes its older steps (``keep_checkpoints``): a step folder
    gone while it was read is said as such, not as "no checkpoint found"."""
    try:
        yield
    except Exception as exc:
        if step.is_dir():
            raise
        raise CheckpointError(
            "the checkpoint was deleted while it was read: a run still training in this "
            "folder keeps only its last checkpoints", where=str(step),
            hint="quantize once the run has ended, or a copy of a step folder") from exc


def _check_vocabularies(manifest: dict[str, Any], dataset: Path | str | None,
                        recorded: str | None) -> None:
    """Refuse, before any work, to export vocabulary features without their vocabularies.

    An artifact without them scores nothing: every later ``predict`` or ``serving.load`` of
    it fails. They live in the training dataset (``vocab/<feature>.parquet``).
    """
    wanted = [f["name"] for f in manifest.get("sparse", []) if f.get("mode") == "vocab"]
    if not wanted:
        return
    if dataset is None:
        raise DatasetError(
            f"the training dataset {recorded or '(not recorded)'} is gone, and features "
            f"{', '.join(wanted)} need its vocabularies", where="--dataset",
            hint="pass --dataset with the dataset the checkpoint was trained on (or a copy)")
    missing = [n for n in wanted if not (Path(dataset) / "vocab" / f"{n}.parquet").is_file()]
    if missing:
        raise DatasetError(f"the vocabularies of {', '.join(missing)} are missing",
                           where=str(Path(dataset) / "vocab"),
                           hint="pass --dataset with the dataset the checkpoint was trained on")


def quantize_to_artifact(checkpoint: str | Path, out: str | Path, config: Any, *,
                         dataset: str | Path | None = None, overwrite: bool = False,
                         tracker: Any = None, log_model: bool = True,
                         sign_key: str | Path | bytes | None = None) -> QuantizedModel:
    """``ctrctl quantize`` as a library call: quantize, place, export, track.

    Args:
        checkpoint: the trained checkpoint (any of its folder forms).
        out: the artifact folder.
        config: a :class:`~ctrctl.inference.quantize.QuantizeConfig`.
        dataset: the training dataset folder (for vocabularies); default: the one the
            checkpoint records, when it still exists.
        overwrite: replace an existing ``out``.
        tracker: a :class:`ctrctl.tracking.Tracker`; the run is tagged with the training
            run's id and, with ``log_model``, gets the artifact as an MLflow pyfunc model.
        sign_key: sign the artifact's manifest with this key (:func:`write_artifact`).

    Returns:
        The quantized model (with its table report and plan).
    """
    from ctrctl import checkpoint as ckpt
    from ctrctl.inference.quantize import quantize_checkpoint
    from ctrctl.tracking import Tracker

    out = Path(out)
    refuse_output_over_inputs(out, [checkpoint, dataset])
    kind = (ckpt.read_metadata(checkpoint).config or {}).get("model", {}).get("kind")
    if kind == "two_tower":
        raise ConfigError("this checkpoint holds a two-tower retrieval model: its export "
                          "is the query tower with the item index", where=str(checkpoint),
                          hint="index its items with ctrctl index --checkpoint "
                               f"{checkpoint} --out INDEX (--kind sq8 or ivfpq: INT8 or PQ "
                               "codes), then ctrctl quantize --index INDEX")
    if out.exists() and not overwrite:
        raise OutputExistsError("the export folder already exists", where=str(out),
                                hint="pass --overwrite to replace it")
    if sign_key is not None:
        sign_key = signing_key(sign_key)  # before the work: a bad key file fails first
    tracker = tracker or Tracker()
    # One step folder, read from here on: a run still training moves `latest` meanwhile.
    step = ckpt.resolve_checkpoint(checkpoint)
    meta = ckpt.read_metadata(step)
    if dataset is None:
        recorded = meta.extra.get("dataset")
        dataset = Path(recorded) if recorded and Path(recorded).is_dir() else None
    _check_vocabularies(meta.extra.get("manifest") or {}, dataset, meta.extra.get("dataset"))
    with tracker.run("quantize") as run:
        run.set_tags(native.log_report(logger).as_tags())
        with _still_there(step):
            quantized = quantize_checkpoint(step, config)
        if quantized.training_run_id:
            run.set_tags({"ctrctl.training_run_id": quantized.training_run_id})
        run.log_params({"checkpoint": str(quantized.checkpoint), **config.to_dict()})
        with _still_there(step), writing(out):
            write_artifact(quantized, out, overwrite=overwrite, dataset=dataset,
                           sign_key=sign_key)
        metrics: dict[str, float] = {
            "bytes.fp32": float(quantized.fp32_bytes),
            "bytes.quantized": float(quantized.quantized_bytes),
            "bytes.ratio": quantized.quantized_bytes / max(quantized.fp32_bytes, 1)}
        for row in quantized.table_report:
            metrics[f"bytes.{row['table']}"] = float(row["bytes"])
        for shard in quantized.plan.shards:
            metrics[f"shard.{shard['shard']}.bytes"] = float(shard["bytes"])
        summary = quantized.plan.extra.get("placement", {}).get("summary", {})
        if summary:  # the planner's estimate of the placement (inference cost mode)
            metrics["placement.request_seconds"] = float(summary["estimated_step_seconds"])
            metrics["placement.imbalance"] = float(summary["imbalance"])
        run.log_metrics(metrics)
        run.log_artifact(out / standalone.MANIFEST)
        run.log_artifact(out / PLAN_FILE)
        if log_model and getattr(tracker, "enabled", False) and run.run_id:
            from ctrctl.inference.pyfunc import log_pyfunc_model

            logged = log_pyfunc_model(out, run_id=run.run_id,
                                      tracking_uri=getattr(tracker, "tracking_uri", None))
            quantized.model_uri = getattr(logged, "model_uri", None)
    return quantized
