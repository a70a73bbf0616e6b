"""Warm starts: a new run that begins from a previous run's weights and optimizer state.

``ctrctl train --init-from CHECKPOINT`` (or ``training.init_from`` in the YAML) builds the
model for the *new* dataset, then fills it from the parent checkpoint: every table block the
current plan puts on this rank (any world size, any plan: the blocks come from whichever
saved pieces overlap them), the fused optimizers' states, the dense weights and the dense
optimizer's state. The step counter, the loader position, early stopping and the RNG start
fresh: a warm start is a new run on new data, not a resume.

The parent must describe the same model: the same ``model`` section and optimizer kinds, the
same dense features and the same sparse features with the same table sizes. One exception: a
hashed feature whose ``hash_size`` grew. Its table is resized: rows ``[0, old)`` keep the
parent's weights and optimizer state bitwise, rows ``[old, new)`` keep what the new model
initialised them with (what a fresh run would have). Any other difference is one
:class:`~ctrctl.errors.ConfigError` naming each.

``models:/NAME@ALIAS`` and ``models:/NAME/VERSION`` name a registered version; its
``ctrctl.checkpoint`` tag (``ctrctl run`` writes it) leads to the training checkpoint, whose
files are checked against the ``ctrctl.checkpoint.sha256`` tag.

Example:
    >>> cfg = load_config("pipelines/small.yaml", ["training.init_from=runs/day1"])
    >>> result = train("data/day2", "runs/day2", cfg)     # starts from day 1's model
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ctrctl import checkpoint as ckpt
from ctrctl.config import PipelineConfig, as_saved_before, flat_keys, parse_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed import checkpoint as dist_ckpt
from ctrctl.errors import CheckpointError, ConfigError, TrackingError
from ctrctl.io import tree_sha256
from ctrctl.models import build as model_io

__all__ = ["Parent", "check_compatible", "resolve_parent", "warm_start"]

logger = logging.getLogger(__name__)

_REGISTRY = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")

#: Settings whose change alters the shape of what the parent saved.
_FIXED = ("model.", "embedding_optimizer.kind", "dense_optimizer.kind")
#: Model settings that say where tables live, not what they hold.
_FREE = ("model.cached_tables", "model.cache_dir")


@dataclass(frozen=True)
class Parent:
    """The model a warm start began from (recorded in the new checkpoint and as run tags).

    Attributes:
        source: what was asked for (a path or a ``models:/`` URI).
        checkpoint: the step folder loaded.
        step: the parent's step count when it was saved.
        run_id: the parent's MLflow training run, when it was tracked.
        model_version: the registered version, for a ``models:/`` source.
        resized: table -> [old rows, new rows] of the hashed tables that grew.
    """

    source: str
    checkpoint: Path
    step: int
    run_id: str = ""
    model_version: str = ""
    resized: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "checkpoint": str(self.checkpoint), "step": self.step,
                "run_id": self.run_id, "model_version": self.model_version,
                "resized": self.resized}

    def tags(self) -> dict[str, str]:
        """MLflow tags of the child run: where its weights came from."""
        return {"ctrctl.parent.source": self.source,
                "ctrctl.parent.checkpoint": str(self.checkpoint),
                "ctrctl.parent.step": str(self.step),
                "ctrctl.parent.run_id": self.run_id,
                "ctrctl.parent.model_version": self.model_version,
                "ctrctl.parent.resized": json.dumps(self.resized, sort_keys=True)}


def _registry_checkpoint(uri: str, tracking_uri: str | None) -> tuple[Path, str]:
    """The training checkpoint a registered version was made from, and that version."""
    match = _REGISTRY.match(uri)
    if match is None:
        raise ConfigError(f"{uri!r} is not models:/NAME@ALIAS or models:/NAME/VERSION",
                          where="training.init_from")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        entry = (client.get_model_version_by_alias(match["name"], match["alias"])
                 if match["alias"] else client.get_model_version(match["name"], match["version"]))
    except Exception as exc:  # MlflowException, a store that cannot be reached
        raise TrackingError(f"cannot resolve {uri}: {exc}", where="training.init_from",
                            hint="check the name, the alias and MLFLOW_TRACKING_URI") from None
    tags = dict(entry.tags or {})
    path = tags.get("ctrctl.checkpoint")
    if not path:
        raise CheckpointError(f"version {entry.version} of {match['name']} names no training "
                              "checkpoint (tag ctrctl.checkpoint)", where=uri,
                              hint="warm start from a version `ctrctl run` registered, or "
                                   "pass the checkpoint folder")
    folder = Path(path)
    expected = tags.get("ctrctl.checkpoint.sha256")
    if not (folder / "metadata.json").is_file():
        raise CheckpointError(f"version {entry.version} of {match['name']} was made from "
                              f"{folder}, which is gone", where=uri,
                              hint="pass another checkpoint with --init-from")
    if expected and tree_sha256(folder) != expected:
        raise CheckpointError(f"the checkpoint of version {entry.version} changed since it "
                              "was registered (sha256 differs)", where=str(folder))
    return folder, str(entry.version)


def resolve_parent(source: str, tracking_uri: str | None = None) -> Parent:
    """The checkpoint ``source`` names: a step folder, a ``checkpoints`` folder, a training
    output folder, or a registered version (``models:/NAME@ALIAS``, ``models:/NAME/N``)."""
    version = ""
    if source.startswith("models:/"):
        folder, version = _registry_checkpoint(source, tracking_uri)
    else:
        folder = Path(source)
    meta = ckpt.read_metadata(folder)
    return Parent(source=source, checkpoint=meta.path, step=meta.step,
                  run_id=str(meta.extra.get("mlflow_run_id") or ""), model_version=version)


def check_compatible(meta: ckpt.CheckpointMetadata, manifest: DatasetManifest,
                     config: PipelineConfig) -> dict[str, list[int]]:
    """Refuse a parent that describes another model than ``config`` on ``manifest``.

    Returns:
        table -> [old rows, new rows] of hashed tables that grew (to be resized).

    Raises:
        ConfigError: naming every difference (settings, dense features, sparse features,
            table sizes) in one message.
    """
    problems: list[str] = []
    saved_cfg, new_cfg = flat_keys(meta.config), flat_keys(config.to_dict())
    saved = meta.extra.get("manifest") or {}
    # the interaction the models have, whether a config names it or leaves it to ``auto``
    saved_cfg["model.interaction"] = parse_config(as_saved_before(meta.config)).model \
        .resolved_interaction(len(saved.get("dense", ())), len(saved.get("sparse", ())))
    new_cfg["model.interaction"] = config.model.resolved_interaction(len(manifest.dense),
                                                                     len(manifest.sparse))
    for key in sorted(set(saved_cfg) | set(new_cfg)):
        if key.startswith(_FIXED) and not key.startswith(_FREE) and \
                saved_cfg.get(key) != new_cfg.get(key):
            problems.append(f"setting {key}: {json.dumps(saved_cfg.get(key))} -> "
                            f"{json.dumps(new_cfg.get(key))}")
    old_dense = [f["name"] for f in saved.get("dense", ())]
    if old_dense != manifest.dense_names:
        problems.append(f"dense features: the model has {old_dense}, the dataset "
                        f"{manifest.dense_names}")
    old_sparse = {f["name"]: f for f in saved.get("sparse", ())}
    new_sparse = {f.name: f for f in manifest.sparse}
    if list(old_sparse) != list(new_sparse):
        gone = [n for n in old_sparse if n not in new_sparse]
        added = [n for n in new_sparse if n not in old_sparse]
        problems.append("sparse features: " + ("; ".join(
            part for part in (f"missing from the dataset {gone}" if gone else "",
                              f"new in the dataset {added}" if added else "",
                              "" if gone or added else "in another order") if part)))
    resized: dict[str, list[int]] = {}
    for name in [n for n in new_sparse if n in old_sparse]:
        old, new = old_sparse[name], new_sparse[name]
        if old.get("mode") != new.mode or bool(old.get("multi_hot")) != new.multi_hot:
            problems.append(f"sparse feature {name}: mode {old.get('mode')}"
                            f"{' multi-hot' if old.get('multi_hot') else ''} -> {new.mode}"
                            f"{' multi-hot' if new.multi_hot else ''}")
            continue
        rows = meta.table_shape(name)[0] if name in meta.tables else int(old["num_embeddings"])
        if rows == new.num_embeddings:
            continue
        if new.mode == "hash" and new.num_embeddings > rows:
            resized[name] = [rows, new.num_embeddings]
            continue
        why = ("a hashed table may grow, not shrink" if new.mode == "hash" else
               "a vocabulary table's ids mean other values once its size changes")
        problems.append(f"table {name}: {rows} rows -> {new.num_embeddings} ({why})")
    if problems:
        raise ConfigError("the model to start from does not fit this dataset and config: "
                          + "; ".join(problems), where=str(meta.path),
                          hint="warm start on data preprocessed with the parent's schema and "
                               "transforms, under the parent's model settings, or train "
                               "from scratch")
    return resized


@torch.no_grad()
def _load_tables(model: nn.Module, meta: ckpt.CheckpointMetadata,
                 resized: dict[str, list[int]]) -> None:
    """Fill this rank's table blocks from the parent; rows past a resized table's old end
    keep their fresh initialisation (weights and optimizer state)."""
    shards = dist_ckpt.local_shards(model)
    wanted: list[tuple[str, int, int, int, int]] = []
    kept: list[tuple[Any, int]] = []  # (shard, rows taken from the parent)
    for s in shards:
        m = s.metadata
        old_rows = resized.get(s.table, [None])[0]
        take = m.rows if old_rows is None else max(0, min(m.rows, old_rows - m.row_offset))
        if take:
            wanted.append((s.table, m.row_offset, m.col_offset, take, m.cols))
            kept.append((s, take))
    pieces = ckpt.load_table_shards(meta.path, wanted, with_optimizer=True)
    for (shard, take), piece in zip(kept, pieces, strict=True):
        shard.weight[:take].copy_(piece.weight.to(shard.weight.dtype))
        if set(shard.optimizer_state) != set(piece.optimizer_state):
            # a data-parallel table is stepped by the dense optimizer: no fused state
            raise CheckpointError(
                f"table {shard.table!r}: the parent holds optimizer state "
                f"{sorted(piece.optimizer_state) or 'none (a data_parallel table)'}, this "
                f"model's is {sorted(shard.optimizer_state) or 'none (data_parallel)'}",
                where=str(meta.path), hint="warm start with the parent's "
                "embedding_optimizer.kind, and plan a table data_parallel in both runs or "
                "in neither")
        rows = shard.metadata.rows
        for name, target in shard.optimizer_state.items():
            # (rows,) for row-wise states, (rows, cols) or flat for element-wise ones
            target.view(rows, -1)[:take].copy_(
                piece.optimizer_state[name].reshape(take, -1).to(target.dtype))


def warm_start(model: nn.Module, optimizer: torch.optim.Optimizer, parent: Parent,
               manifest: DatasetManifest, config: PipelineConfig) -> Parent:
    """Load ``parent`` into a freshly built (and wrapped) model and its dense optimizer.

    Args:
        model: the new run's model, sharded by the new plan or not.
        optimizer: the new run's dense optimizer (its state is replaced by the parent's).
        parent: from :func:`resolve_parent`.
        manifest, config: the new run's dataset and settings (checked against the parent's).

    Returns:
        ``parent`` with the tables that were resized.
    """
    meta = ckpt.read_metadata(parent.checkpoint)
    resized = check_compatible(meta, manifest, config)
    _load_tables(model, meta, resized)
    dense, optim_state = ckpt.load_dense(meta.path)
    model_io.load_dense_state(model, dense)
    optimizer.load_state_dict(optim_state)
    for table, (old, new) in resized.items():
        logger.info("warm start: table %s grew from %d to %d rows; the new rows start fresh",
                    table, old, new)
    logger.info("warm start from %s (step %d)", meta.path, meta.step)
    return Parent(parent.source, parent.checkpoint, parent.step, parent.run_id,
                  parent.model_version, resized)
