"""The settings a resumed run continues with: its own, with the overrides given on top.

``ctrctl train --out RUN --resume`` reads ``RUN/config.json`` (written when the run started),
so a resume needs no flags but ``--resume``; overrides (``training.epochs=4``) apply on top.
A setting that changes the shape of what was saved (the model, the optimizers' kinds) cannot
resume: it is refused naming the key, its saved value and the new one.

Example:
    >>> cfg = resume_config("runs/a", None, ["training.epochs=4"])
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from ctrctl.config import ADDED_SINCE, PipelineConfig, flat_keys, load_config
from ctrctl.errors import ConfigError

logger = logging.getLogger(__name__)

#: Settings fixed by what a checkpoint holds; any other may change across a resume.
FIXED = ("model", "embedding_optimizer.kind", "dense_optimizer.kind")


def saved_config(out: str | Path) -> Path | None:
    """The run's ``config.json``, or None for a run that has none yet."""
    path = Path(out) / "config.json"
    return path if path.is_file() else None


def check_resumable(saved: PipelineConfig, new: PipelineConfig, where: str) -> None:
    """Refuse settings that cannot continue the saved run, naming each."""
    before, after = flat_keys(saved.to_dict()), flat_keys(new.to_dict())
    changed = [k for k in sorted(set(before) | set(after))
               if k.startswith(FIXED) and before.get(k) != after.get(k)]
    if changed:
        detail = ", ".join(f"{k}: {json.dumps(before.get(k))} -> {json.dumps(after.get(k))}"
                           for k in changed)
        raise ConfigError(f"these settings cannot change when resuming: {detail}",
                          where=where, hint="drop them, or start a new run in another --out")


def resume_config(out: str | Path, config: str | Path | None,
                  overrides: Sequence[str] = ()) -> PipelineConfig:
    """The config a resume of ``out`` trains with.

    Args:
        out: the run folder.
        config: a pipeline YAML given explicitly (its settings must not change the model),
            or None to continue with the run's own ``config.json``.
        overrides: ``key=value`` on top.
    """
    saved = saved_config(out)
    if saved is None:
        return load_config(config, overrides)
    older = _settings_added_since(saved)
    if config is None:
        logger.info("resuming with the run's settings (%s)%s", saved,
                    f" and {' '.join(overrides)}" if overrides else "")
        resumed = load_config(saved, [*older, *overrides])
        check_resumable(load_config(saved, older), resumed, f"{saved} + overrides")
        return resumed
    resumed = load_config(config, overrides)
    check_resumable(load_config(saved, older), resumed, str(config))
    return resumed


def _settings_added_since(saved: Path) -> list[str]:
    """Overrides giving a ``config.json`` written before a model setting existed the value
    its run trained with (:data:`ctrctl.config.ADDED_SINCE`)."""
    try:
        written = flat_keys(json.loads(saved.read_text()))
    except (OSError, ValueError):
        return []  # load_config reports an unreadable file itself
    return [f"{section}.{key}={json.dumps(value)}" for section, key, value in ADDED_SINCE
            if f"{section}.{key}" not in written]
