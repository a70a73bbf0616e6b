"""The search space of ``ctrctl tune``: pipeline YAML keys and the values each may take.

A space is a list of :class:`Param`, one per dotted pipeline key (``embedding_optimizer.lr``,
``model.interaction`` ...): a range ``{low, high, log}`` or a list ``{choices: [...]}``. A
``--space`` YAML holds the same mapping::

    embedding_optimizer.lr: {low: 0.005, high: 0.5, log: true}
    model.embedding_dim: {choices: [8, 16, 32]}
    model.over_arch: {choices: [[64, 32, 1], [256, 128, 1]]}

Every key is checked against the pipeline config models (an unknown key, low > high, a value
the key does not accept: one :class:`~ctrctl.errors.ConfigError` naming the key and the
file). ``model.dense_arch`` choices name the hidden layers: the layer of ``embedding_dim``
width that joins the embeddings is added when a choice does not end there, so the arch
follows a searched ``embedding_dim``.

Example:
    >>> space = default_space(load_config(), manifest)
    >>> [p.key for p in space][:2]
    ['embedding_optimizer.lr', 'dense_optimizer.lr']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ctrctl.config import PipelineConfig, apply_overrides, key_location, parse_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError
from ctrctl.io import read_text
from ctrctl.training.sizes import auto_batch_size

__all__ = ["Param", "check_space", "default_space", "load_space", "overrides_for",
           "space_from_mapping", "values_of"]

#: Keys a ``--space`` entry may hold.
_RANGE_KEYS = {"low", "high", "log", "step"}


@dataclass(frozen=True)
class Param:
    """One searched key.

    Attributes:
        key: the dotted pipeline key (``embedding_optimizer.lr``).
        low, high: the range (both set) of a numeric key.
        log: sample the range on a log scale.
        integer: the range holds integers.
        choices: the values of a categorical key (lists are allowed: architectures).
    """

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial draws for this key (decoded: lists come back lists)."""
        if self.choices:
            encoded = [_encode(c) for c in self.choices]
            return _decode(trial.suggest_categorical(self.key, encoded))
        assert self.low is not None and self.high is not None
        if self.integer:
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, log=self.log)

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is one this key can take (the base config's point)."""
        if self.choices:
            return _encode(value) in [_encode(c) for c in self.choices]
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high

    def encoded(self, value: Any) -> Any:
        """``value`` as Optuna stores it (a list as its JSON text)."""
        return _encode(value) if self.choices else value

    def describe(self) -> str:
        if self.choices:
            return f"{self.key} in {list(self.choices)}"
        return f"{self.key} in [{self.low:g}, {self.high:g}]{' log' if self.log else ''}"


def _encode(value: Any) -> Any:
    """Optuna's categoricals take scalars: a list is stored as its JSON text."""
    return json.dumps(list(value)) if isinstance(value, (list, tuple)) else value


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("["):
        return json.loads(value)
    return value


def _get(config: PipelineConfig, key: str) -> Any:
    node: Any = config.to_dict()
    for part in key.split("."):
        node = node[part]
    return node


def _exists(config: PipelineConfig, key: str) -> bool:
    node: Any = config.to_dict()
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return not isinstance(node, dict)


def default_space(config: PipelineConfig, manifest: DatasetManifest,
                  world_size: int = 1) -> list[Param]:
    """The built-in space: what tuning by hand found to matter on the shared samples.

    Learning rates (log scale), embedding width, the interaction, the MLP shapes (the dense
    arch only when the dataset has dense features), the batch size at half, once and twice
    the sized default, and the embeddings' weight decay. The DLRM has no dropout, so none
    is searched.
    """
    rows = manifest.split("train").rows
    batch = config.training.batch_size or auto_batch_size(rows, world_size)
    batches = sorted({max(world_size, batch // 2), batch, batch * 2})
    space = [
        Param("embedding_optimizer.lr", 0.005, 0.5, log=True),
        Param("dense_optimizer.lr", 0.001, 0.1, log=True),
        Param("model.embedding_dim", choices=(8, 16, 32)),
        Param("model.interaction", choices=("dot", "dcn")),
    ]
    if manifest.dense:
        space.append(Param("model.dense_arch", choices=((64,), (128, 64), (256, 128))))
    space += [
        Param("model.over_arch", choices=((64, 32, 1), (256, 128, 1), (512, 256, 1))),
        Param("training.batch_size", choices=tuple(batches)),
        Param("embedding_optimizer.weight_decay", 1e-9, 1e-4, log=True),
    ]
    return space


def _param(key: str, spec: Any, where: str) -> Param:
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{key}: expected {{low, high, log}} or {{choices: [...]}}, got "
                          f"{spec!r:.60}", where=where)
    if "choices" in spec:
        extra = sorted(set(spec) - {"choices"})
        choices = spec["choices"]
        if extra or not isinstance(choices, list) or not choices:
            raise ConfigError(f"{key}: choices must be a non-empty list and stand alone "
                              f"(got {extra or choices!r:.60})", where=where)
        return Param(key, choices=tuple(tuple(c) if isinstance(c, list) else c
                                        for c in choices))
    unknown = sorted(set(spec) - _RANGE_KEYS)
    if unknown or "low" not in spec or "high" not in spec:
        raise ConfigError(f"{key}: a range takes low, high and log (got "
                          f"{sorted(spec)})", where=where,
                          hint="or give {choices: [...]}")
    low, high = spec["low"], spec["high"]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
        raise ConfigError(f"{key}: low and high must be numbers", where=where)
    if low > high:
        raise ConfigError(f"{key}: low {low} is above high {high}", where=where,
                          hint="swap them")
    log = bool(spec.get("log", False))
    if log and low <= 0:
        raise ConfigError(f"{key}: a log range needs low > 0 (got {low})", where=where)
    return Param(key, float(low), float(high), log=log,
                 integer=isinstance(low, int) and isinstance(high, int))


def check_space(space: Sequence[Param], base: Mapping[str, Any], where: str) -> None:
    """Every key exists in the pipeline config and accepts each end of its range or choice.

    Raises:
        ConfigError: naming the first bad key (and ``where`` it was written).
    """
    config = parse_config(base)
    for param in space:
        if not _exists(config, param.key):
            raise ConfigError(f"unknown key {param.key!r} in the search space", where=where,
                              hint="use pipeline YAML keys such as embedding_optimizer.lr "
                              "(`ctrctl config show` lists them)")
        values = param.choices or (param.low, param.high)
        for value in values:
            point = {param.key: value}
            if param.key == "model.dense_arch":
                point = dense_arch_point(config, point)
            try:
                parse_config(apply_overrides(base, [f"{k}={json.dumps(_plain(v))}"
                                                    for k, v in point.items()]))
            except ConfigError as exc:
                raise ConfigError(f"{param.key}: the value {value!r} is not accepted "
                                  f"({exc.message})", where=where) from None


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def dense_arch_point(config: PipelineConfig, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with ``model.dense_arch`` ending at the (searched) embedding width."""
    out = dict(values)
    dim = out.get("model.embedding_dim", config.model.embedding_dim)
    arch = out.get("model.dense_arch")
    if arch:
        arch = list(arch)
        out["model.dense_arch"] = arch if arch[-1] == dim else arch + [dim]
    elif arch is None and config.model.dense_arch and config.model.dense_arch[-1] != dim:
        # the base arch's last layer follows a searched width (hidden layers kept)
        out["model.dense_arch"] = [*config.model.dense_arch[:-1], dim]
    return out


def overrides_for(config: PipelineConfig, values: Mapping[str, Any]) -> list[str]:
    """``key=value`` overrides that set a trial's values on the base config."""
    point = dense_arch_point(config, values)
    return [f"{k}={json.dumps(_plain(v))}" for k, v in point.items()]


def values_of(space: Sequence[Param], config: PipelineConfig,
              sized: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The base config's point in the space (encoded as Optuna stores it), or None when a
    value lies outside it (a log range cannot hold a weight decay of 0: its low is used).
    ``sized``: values for keys the config leaves at null or ``auto`` (the sized batch size,
    the interaction ``auto`` resolves to)."""
    point: dict[str, Any] = {}
    for param in space:
        value = _get(config, param.key)
        if value is None or value == "auto":
            value = (sized or {}).get(param.key, value)
        if param.key == "model.dense_arch" and value and value[-1] == config.model.embedding_dim:
            value = value[:-1] or value
        if isinstance(value, list):
            value = tuple(value)
        if param.log and value == 0 and param.low is not None:
            value = param.low
        if not param.contains(value):
            return None
        point[param.key] = param.encoded(value)
    return point


def load_space(path: str | Path, base: Mapping[str, Any]) -> list[Param]:
    """Read a ``--space`` YAML and check it against the pipeline config.

    Raises:
        ConfigError: the file is not a mapping, or a key or range is bad (naming it).
    """
    text = read_text(path, ConfigError, "search space", hint="pass a YAML of key: {low, high}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", where=str(path)) from None
    if not isinstance(data, Mapping) or not data:
        raise ConfigError("a search space is a mapping of pipeline keys to {low, high, log} "
                          "or {choices: [...]}", where=str(path))
    space = [_param(str(k), v, key_location(path, [k])) for k, v in data.items()]
    check_space(space, base, str(path))
    return space


def space_from_mapping(data: Mapping[str, Any], base: Mapping[str, Any],
                       where: str = "tune.space") -> list[Param]:
    """A space written inline (a pipeline's ``tune.space``), checked as :func:`load_space`."""
    space = [_param(str(k), v, f"{where}.{k}") for k, v in data.items()]
    check_space(space, base, where)
    return space
