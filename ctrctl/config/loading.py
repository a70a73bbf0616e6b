"""Loading a pipeline YAML: parse, apply ``key=value`` overrides, validate into a
:class:`~ctrctl.config.sections.PipelineConfig`, and name the file and line of a bad key."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ctrctl.config.sections import PipelineConfig
from ctrctl.errors import ConfigError
from ctrctl.io import read_text

__all__ = [
    "ADDED_SINCE",
    "REMOVED_KEYS",
    "apply_overrides",
    "as_saved_before",
    "defaults_path",
    "dump_config",
    "flat_keys",
    "key_location",
    "load_config",
    "parse_config",
]


# ---- loading -----------------------------------------------------------------------------
def _key_line(text: str, loc: Sequence[Any]) -> int | None:
    """The 1-based line of the key at ``loc`` in YAML ``text`` (None when not found)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == str(part):
                    line, node = key_node.start_mark.line + 1, value_node
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def key_location(path: str | Path, loc: Sequence[Any]) -> str:
    """``FILE:LINE`` of the key at ``loc`` (e.g. ``("eval", "gates", "auc")``) in a YAML file;
    just ``FILE`` when the file cannot be read or the key is not in it (a default)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return str(path)
    line = _key_line(text, loc)
    return f"{path}:{line}" if line else str(path)


def _raise_validation(exc: ValidationError, where: str, text: str | None) -> None:
    """Turn pydantic's first error into a ConfigError naming the key, file and line."""
    first = exc.errors()[0]
    loc = [p for p in first["loc"] if p not in ("function-after",)]
    key = ".".join(str(p) for p in loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        message = f"unknown key {key!r}"
        hint = ("check the spelling; the keys are documented in ctrctl/config/sections.py "
                "(model: in model_section.py)")
    else:
        message = f"{key}: {first['msg']}"
        hint = None
    line = _key_line(text, loc) if text is not None else None
    raise ConfigError(message, where=f"{where}:{line}" if line else where, hint=hint) from None


#: Keys that no command read and were removed; configs saved in older checkpoints still
#: carry them, so they are dropped (with a warning) rather than refused.
REMOVED_KEYS: tuple[tuple[str, str], ...] = (
    ("preprocess", "schema_path"), ("preprocess", "inputs"), ("eval", "splits"))


#: Model settings added after ctrctl began saving configs (a run's ``config.json``, a
#: checkpoint's metadata), with the value that builds the model such a config saved.
ADDED_SINCE: tuple[tuple[str, str, Any], ...] = (("model", "first_order", False),)


def flat_keys(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as ``{"section.key": value}``: the dotted keys overrides use."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(flat_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def as_saved_before(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config ctrctl saved, with each setting it predates (:data:`ADDED_SINCE`) at the
    value its run trained with; user configs are not passed here (they get the defaults)."""
    out = dict(data)
    for section, key, value in ADDED_SINCE:
        part = out.get(section)
        part = dict(part) if isinstance(part, Mapping) else {}
        part.setdefault(key, value)
        out[section] = part
    return out


def _drop_removed(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    out = dict(data)
    for section, key in REMOVED_KEYS:
        part = out.get(section)
        if isinstance(part, Mapping) and key in part:
            out[section] = {k: v for k, v in part.items() if k != key}
            logging.getLogger(__name__).warning(
                "%s: %s.%s is no longer a setting (no command read it); ignored",
                where, section, key)
    return out


def parse_config(
    data: Mapping[str, Any] | None, where: str = "config", text: str | None = None
) -> PipelineConfig:
    """Validate a config's data.

    Args:
        data: the parsed YAML (a mapping) or None for all defaults.
        where: where it came from, for error messages.
        text: the YAML source, to point errors at a line.

    Raises:
        ConfigError: naming the unknown or invalid key and where it is.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("a pipeline config must be a mapping of sections", where=where)
    try:
        return PipelineConfig.model_validate(_drop_removed(data, where))
    except ValidationError as exc:
        _raise_validation(exc, where, text)
        raise  # unreachable: _raise_validation always raises


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set dotted ``key=value`` overrides into a copy of a config's data.

    Args:
        data: the config's data (as parsed from YAML).
        overrides: ``section.key=value`` strings; values are parsed as YAML.

    Returns:
        The new data; it is validated by :func:`parse_config`, which names a bad key.

    Raises:
        ConfigError: when an override is not of the form ``key=value``.
    """
    result = copy.deepcopy(dict(data))
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"override {item!r} is not of the form key=value",
                where="command line",
                hint="e.g. training.batch_size=1024",
            )
        parts = key.split(".")
        node: dict[str, Any] = result
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {key!r}: {part!r} is not a section",
                                  where="command line")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return result


def defaults_path() -> Path:
    """The built-in defaults' YAML: ``ctrctl/defaults/default.yaml`` inside the package
    (``pipelines/default.yaml`` in a checkout is a link to it).

    The pydantic defaults of every section equal this file (a test holds them together),
    so a pipeline YAML that leaves a key out gets the value written here.
    """
    from importlib.resources import files

    return Path(str(files("ctrctl") / "defaults" / "default.yaml"))


def dump_config(config: PipelineConfig) -> str:
    """The resolved config as YAML, sections in file order (what ``ctrctl config show``
    prints; it loads back to the same config)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=None)


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = ()
) -> PipelineConfig:
    """Load a pipeline YAML, apply overrides, validate, and return the frozen config.

    Args:
        path: the YAML file; None for the built-in defaults (:func:`defaults_path`).
        overrides: dotted ``key=value`` strings that win over the file.

    Raises:
        ConfigError: for a missing or unreadable file, invalid YAML, an unknown key or a
            value of the wrong type, naming the key and the file (or the command line).

    Example:
        >>> load_config(None, ["training.seed=3"]).training.seed
        3
    """
    text: str | None = None
    data: Any = {}
    if path is None:
        path = defaults_path()
    path = Path(path)
    where = str(path)
    text = read_text(path, ConfigError, "config file", hint="pass an existing pipelines/*.yaml")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", where=where) from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("a pipeline config must be a mapping of sections", where=where)
    if overrides:
        merged = apply_overrides(data, overrides)
        # Validate the file alone first so an error in it points at its line.
        parse_config(data, where=where, text=text)
        try:
            return PipelineConfig.model_validate(_drop_removed(merged, where))
        except ValidationError as exc:
            _raise_validation(exc, f"{where} + overrides ({' '.join(overrides)})", None)
            raise
    return parse_config(data, where=where, text=text)
