"""Lineage: the dataset splits each step read or wrote, and the registered model's tags.

A split is logged as an MLflow dataset whose digest is our own sha256 over its Parquet
files (:func:`ctrctl.io.tree_sha256`), not MLflow's digest of its first rows; the
registered model version carries the same value as a tag, so walking version -> run ->
dataset inputs leads back to the files.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ctrctl.io import tree_sha256
from ctrctl.runner.state import HashCache
from ctrctl.tracking import DatasetRef, Run, git_commit

logger = logging.getLogger(__name__)

#: The splits each step reads ("input") or writes ("output"), by MLflow context name.
STEP_SPLITS: dict[str, tuple[tuple[str, str], ...]] = {
    "preprocess": (("train", "output"), ("val", "output"), ("test", "output")),
    "train": (("train", "training"), ("val", "validation")),
    "eval": (("$eval", "evaluation"),),
    "quantize": (("train", "training"),),
}


def split_files(dataset: Path, split: str) -> list[Path]:
    """The Parquet files of one split, as its manifest lists them."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    info = manifest.get("splits", {}).get(split)
    if not info:
        return []
    return [dataset / name for name in info.get("files", ())]


def split_sha256(dataset: Path, split: str, cache: HashCache | None = None) -> str | None:
    """The sha256 of a split's files (None when the dataset has no such split)."""
    files = split_files(dataset, split)
    if not files:
        return None
    return cache.tree(dataset, files) if cache is not None else tree_sha256(dataset, files)


def dataset_ref(name: str, dataset: Path, split: str, cache: HashCache | None) -> DatasetRef | None:
    """A split as a :class:`DatasetRef`: sha256, folder, schema from the manifest."""
    digest = split_sha256(dataset, split, cache)
    if digest is None:
        return None
    manifest = json.loads((dataset / "manifest.json").read_text())
    schema = {manifest.get("label", "label"): "integer"}
    schema.update({f["name"]: "float" for f in manifest.get("dense", ())})
    schema.update({f["name"]: "long" for f in manifest.get("sparse", ())})
    info = manifest["splits"][split]
    return DatasetRef(name=f"{name}/{split}", sha256=digest,
                      source=str((dataset / split).resolve()), schema=schema,
                      profile={"rows": info.get("rows"), "files": len(info.get("files", ())),
                               "schema_hash": manifest.get("schema_hash", "")})


def log_step_datasets(run: Run, step: str, name: str, dataset: Path, eval_split: str,
                      cache: HashCache | None) -> None:
    """Log the splits ``step`` read or wrote into its run."""
    if not (dataset / "manifest.json").is_file():
        return
    for split, context in STEP_SPLITS.get(step, ()):
        split = eval_split if split == "$eval" else split
        ref = dataset_ref(name, dataset, split, cache)
        if ref is not None:
            run.log_dataset(ref, context)


def registry_tags(ctx: Any) -> dict[str, str]:
    """The tags that make a registered version verifiable on its own."""
    from ctrctl.runner.steps import gate_texts, quantize_settings

    dataset: Path = ctx.dataset
    manifest = json.loads((dataset / "manifest.json").read_text())
    tags: dict[str, str] = {
        "ctrctl.pipeline": ctx.cfg.name,
        "ctrctl.pipeline_run_id": ctx.parent_run_id or "",
        "ctrctl.dataset.source": str(dataset.resolve()),
        "ctrctl.schema.hash": manifest.get("schema_hash", ""),
        "ctrctl.plan": str(ctx.plan.resolve()),
        "ctrctl.plan.sha256": tree_sha256(ctx.plan) if ctx.plan.is_file() else "",
        "ctrctl.checkpoint": str(ctx.checkpoint().resolve()),
        "ctrctl.checkpoint.sha256": tree_sha256(ctx.checkpoint()),
        "ctrctl.quantize": json.dumps(quantize_settings(ctx.cfg), sort_keys=True),
        "ctrctl.gates": json.dumps(gate_texts(ctx.cfg)),
        "ctrctl.training_run_id": ctx.summaries.get("train", {}).get("run_id") or "",
        "ctrctl.git_commit": git_commit() or "",
    }
    for split in manifest.get("splits", {}):
        digest = split_sha256(dataset, split)
        if digest:
            tags[f"ctrctl.dataset.{split}.sha256"] = digest
    tags["ctrctl.dataset.digest"] = tags.get("ctrctl.dataset.train.sha256", "")
    tags.update(parent_tags(ctx.checkpoint()))
    evaluated = ctx.summaries.get("eval", {})
    if (ctx.index / "manifest.json").is_file():  # a two-tower pipeline's item index
        tags["ctrctl.index.sha256"] = tree_sha256(ctx.index)
        tags["ctrctl.index.kind"] = str(json.loads(
            (ctx.index / "manifest.json").read_text()).get("kind", ""))
    for key in ("auc", "logloss", "ne", "calibration", "ece", "pr_auc", "rows", "recall@100",
                "index.recall@100", "popularity.recall@100", "bpr.recall@100"):
        if evaluated.get(key) is not None:
            tags[f"ctrctl.eval.{key}"] = repr(evaluated[key])
    tags["ctrctl.eval.split"] = ctx.cfg.runner.eval_split
    tags["ctrctl.gates.passed"] = str(bool(evaluated.get("gates_passed", False))).lower()
    tags["ctrctl.gates.results"] = json.dumps(evaluated.get("gates", []))
    return tags


def parent_tags(checkpoint: Path) -> dict[str, str]:
    """The warm start's parent of a checkpoint (none for a run trained from scratch)."""
    from ctrctl.checkpoint import read_metadata

    parent = read_metadata(checkpoint).extra.get("parent") or {}
    return {f"ctrctl.parent.{key}": str(parent.get(key, ""))
            for key in ("source", "checkpoint", "step", "model_version")} if parent else {}


def register(ctx: Any) -> dict[str, Any]:
    """Register the quantize step's pyfunc model as a new version; move the alias only when
    every gate passed. Returns the step's summary (the model URI first)."""
    quantize_run = ctx.summaries.get("quantize", {}).get("run_id")
    if not quantize_run:
        from ctrctl.errors import TrackingError

        raise TrackingError("the quantize step recorded no MLflow run to register from",
                            hint="rerun with --force --from quantize")
    name = ctx.cfg.register.model_name
    passed = bool(ctx.summaries.get("eval", {}).get("gates_passed", False))
    alias = ctx.cfg.register.alias if passed else None
    version = ctx.tracker.register_model(name, f"runs:/{quantize_run}/model", quantize_run,
                                         registry_tags(ctx), alias)
    if not passed:
        logger.warning("a gate failed: version %s of %s registered, alias %r not moved",
                       version, name, ctx.cfg.register.alias)
    summary: dict[str, Any] = {"model_uri": f"models:/{name}/{version}", "version": version,
                               "alias_moved": passed, "alias": ctx.cfg.register.alias}
    if passed and version and ctx.cfg.register.champion_metric:
        from ctrctl.runner.promotion import promote

        decision = promote(ctx, name, str(version))
        summary.update({"champion": decision.promote, "champion_gain": decision.gain,
                        "candidate_score": decision.candidate,
                        "champion_score": decision.champion,
                        "champion_version": decision.champion_version})
    return summary
