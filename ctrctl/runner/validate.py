"""A pipeline checked whole before any step runs: each problem named with its file and line."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ctrctl.config import PipelineConfig, key_location
from ctrctl.errors import ConfigError, CtrctlError

if TYPE_CHECKING:
    from ctrctl.inference.quantize import QuantizeConfig

__all__ = ["check_pipeline", "input_paths", "quantize_config"]


def quantize_config(cfg: PipelineConfig) -> QuantizeConfig:
    """The :class:`~ctrctl.inference.quantize.QuantizeConfig` of a pipeline's quantize
    section (its checks raise here, before any step runs)."""
    from ctrctl.inference.quantize import QuantizeConfig
    from ctrctl.inference.shard import DEFAULT_REQUEST_SIZE

    q = cfg.quantize
    return QuantizeConfig(dtype=q.dtype, per_table=dict(q.per_table), num_shards=q.num_shards,
                          device_memory_bytes=q.device_memory_bytes,
                          dense_dtype=q.dense_dtype,
                          request_size=q.request_size or DEFAULT_REQUEST_SIZE)


def input_paths(items: Sequence[str]) -> list[tuple[str | None, list[Path]]]:
    """``[SPLIT=]PATH`` items with their globs expanded: (split, matching files)."""
    from ctrctl.data.readers import parse_input

    result = []
    for item in items:
        source = parse_input(item)
        text = str(source.path)
        matches = sorted(Path(p) for p in glob.glob(text)) if glob.has_magic(text) \
            else [source.path]
        result.append((source.split, matches))
    return result


def _where(source: str | None, *loc: str) -> str:
    return key_location(source, loc) if source else "config (" + ".".join(loc) + ")"


def check_pipeline(cfg: PipelineConfig, source: str | None) -> None:
    """Check what can be checked before running: inputs exist, the schema parses, gates
    name real metrics, the plan fits the processes, the quantize settings are valid.

    Args:
        cfg: the resolved config (file plus overrides).
        source: the pipeline YAML, to point errors at a line.

    Raises:
        ConfigError, SchemaError: naming the key, the file and the line.
    """
    _check_inputs(cfg, source)
    _check_schema(cfg, source)
    _check_gates(cfg, source)
    from ctrctl.runner.retrieval_steps import check_retrieval_pipeline

    check_retrieval_pipeline(cfg, _where(source, "eval", "gates"))
    world = cfg.plan.world_size
    if world > cfg.runner.nproc_per_node:
        raise ConfigError(
            f"the plan is for {world} ranks but the run starts "
            f"{cfg.runner.nproc_per_node} process(es)", where=_where(source, "plan", "world_size"),
            hint=f"set runner.nproc_per_node={world} or plan.world_size="
                 f"{cfg.runner.nproc_per_node}")
    batch = cfg.training.batch_size
    if batch is not None and batch % world:
        raise ConfigError(f"training.batch_size {batch} does not divide over {world} ranks",
                          where=_where(source, "training", "batch_size"))
    if cfg.quantize.enabled:
        try:
            quantize_config(cfg)
        except CtrctlError as exc:
            raise ConfigError(exc.message, where=_where(source, "quantize"),
                              hint=exc.hint) from None
    if cfg.register.model_name is not None and not cfg.quantize.enabled:
        raise ConfigError("register.model_name is set but quantize.enabled is false: "
                          "there is no model to register", where=_where(source, "register"),
                          hint="enable quantize or drop register.model_name")


def _check_inputs(cfg: PipelineConfig, source: str | None) -> None:
    if cfg.synth.format is not None:
        if cfg.data.inputs:
            raise ConfigError("data.inputs and synth.format exclude each other: synth makes "
                              "the inputs", where=_where(source, "data", "inputs"),
                              hint="drop one of them")
        return
    if not cfg.data.inputs:
        raise ConfigError("no inputs: set data.inputs (or synth.format for synthetic logs)",
                          where=_where(source, "data"),
                          hint="e.g. data.inputs=[train=day_0.tsv,test=day_1.tsv]")
    for item, (_, matches) in zip(cfg.data.inputs, input_paths(cfg.data.inputs), strict=True):
        if not matches:
            raise ConfigError(f"input {item!r} matches no file",
                              where=_where(source, "data", "inputs"),
                              hint="point data.inputs at existing files (key=value overrides)")
        for path in matches:
            if not path.is_file():
                raise ConfigError(f"input {str(path)!r} is not a file",
                                  where=_where(source, "data", "inputs"),
                                  hint="point data.inputs at existing files "
                                       "(e.g. data.inputs=[train=PATH])")


def _check_schema(cfg: PipelineConfig, source: str | None) -> None:
    from ctrctl.data.schema import load_schema

    if cfg.data.schema_path is None:
        raise ConfigError("no schema: set data.schema_path", where=_where(source, "data"),
                          hint="e.g. data.schema_path=schemas/criteo.yaml")
    try:
        load_schema(cfg.data.schema_path)
    except CtrctlError as exc:
        raise type(exc)(exc.message, where=f"{exc.where or cfg.data.schema_path} (named at "
                        f"{_where(source, 'data', 'schema_path')})", hint=exc.hint) from None


def _check_gates(cfg: PipelineConfig, source: str | None) -> None:
    from ctrctl.evaluation.gates import gates_from_mapping

    for metric, bound in cfg.eval.gates.items():
        try:
            gates_from_mapping({metric: bound})
        except CtrctlError as exc:
            raise ConfigError(f"gate {metric}: {exc.message}",
                              where=_where(source, "eval", "gates", metric),
                              hint=exc.hint) from None
