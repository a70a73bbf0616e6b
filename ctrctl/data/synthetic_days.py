"""Synthetic click logs over days: new ids arrive, old ones fade, per-id effects are planted.

``ctrctl synth --days D --new-ids-per-day F --popularity-drift R`` writes one CSV per day::

    click,day,hour,user,item                 user: 16 hex digits (a random 64-bit key)
    1,1,13,9f3c0b2a11d4e8f7,48213           item: an int key; day: the data time (days)

Ids: ``initial_ids`` users exist on day 1 and ``F`` new ones are born each day after it;
items likewise at a quarter of the rate. An id born on day ``b`` is drawn on day ``d`` with
weight ``zipf(rank) * exp(-R * (d - b))``: newcomers are popular, old ids fade. Every user
and every item has a planted effect drawn once::

    logit = bias + effect_user[u] + effect_item[i] + effect_hour[h];   click ~ Bernoulli(p)

so a model that gives two ids one row (a hash collision, or the shared default row of a
managed-collision table) loses a known amount of AUC: the best AUC per day is written in
``synth.json`` beside the true probabilities (``day_N.prob.npy``).

Example:
    >>> result = synthesize_days(Path("days"), days=7, rows_per_day=20_000, seed=0)
    >>> result.best_auc[7]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.errors import ConfigError
from ctrctl.io import staged_folder, write_json_atomic
from ctrctl.metrics.functional import roc_auc

#: The effects' spread (logit units): large enough that a lost row costs visible AUC.
EFFECT_STD = 0.8
#: Zipf exponent of the base popularity of ids.
ZIPF = 1.05
#: Intercept: a label rate near 20% with the effects above.
BIAS = -1.8


@dataclass(frozen=True)
class DaysResult:
    """What :func:`synthesize_days` wrote.

    Attributes:
        out: the folder. files: day -> CSV. rows: day -> rows.
        best_auc: day -> AUC of the true probabilities. distinct: feature -> ids born.
    """

    out: Path
    files: dict[int, Path]
    rows: dict[int, int]
    label_rate: dict[int, float]
    best_auc: dict[int, float]
    distinct: dict[str, int]


@dataclass(frozen=True)
class _Population:
    keys: np.ndarray  # (N,) keys as written
    born: np.ndarray  # (N,) birth day
    base: np.ndarray  # (N,) base popularity
    effect: np.ndarray  # (N,) planted logit effect

    def weights(self, day: int, drift: float) -> np.ndarray:
        alive = self.born <= day
        w = np.where(alive, self.base * np.exp(-drift * (day - self.born)), 0.0)
        return w / w.sum()


def _population(rng: np.random.Generator, initial: int, per_day: int, days: int,
                hex_keys: bool) -> _Population:
    count = initial + per_day * (days - 1)
    born = np.concatenate([np.ones(initial, dtype=np.int64)]
                          + [np.full(per_day, d, dtype=np.int64) for d in range(2, days + 1)])
    base = 1.0 / (rng.permutation(count) + 1.0) ** ZIPF
    if hex_keys:
        keys = rng.integers(0, 2**63, size=count, dtype=np.int64) * 2 + rng.integers(0, 2, count)
        return _Population(keys.astype(np.uint64), born, base,
                           rng.normal(0.0, EFFECT_STD, count))
    keys = rng.choice(10 * count, size=count, replace=False).astype(np.int64)
    return _Population(keys, born, base, rng.normal(0.0, EFFECT_STD, count))


def synthesize_days(
    out: Path,
    days: int = 7,
    rows_per_day: int = 20_000,
    new_ids_per_day: int = 2_000,
    popularity_drift: float = 0.3,
    initial_ids: int = 5_000,
    seed: int = 0,
    overwrite: bool = False,
) -> DaysResult:
    """Write ``day_1.csv`` .. ``day_D.csv``, their true probabilities and ``synth.json``.

    Args:
        out: the output folder (refused if it exists, unless ``overwrite``).
        days: D, at least 2.
        rows_per_day: impressions per day.
        new_ids_per_day: users born each day after the first (items: a quarter of it).
        popularity_drift: R, the daily decay rate of an id's popularity.
        initial_ids: users on day 1 (items: half of it).
        seed: the same arguments give the same bytes.
    """
    if days < 2 or rows_per_day < 1 or new_ids_per_day < 0 or initial_ids < 1:
        raise ConfigError(f"days={days}, rows_per_day={rows_per_day}, new_ids_per_day="
                          f"{new_ids_per_day}, initial_ids={initial_ids}: need days >= 2 and "
                          "positive counts", where="synthesize_days")
    if not math.isfinite(popularity_drift) or popularity_drift < 0:
        raise ConfigError(f"popularity_drift={popularity_drift} must be >= 0",
                          where="synthesize_days")
    rng = np.random.default_rng(seed)
    users = _population(rng, initial_ids, new_ids_per_day, days, hex_keys=True)
    items = _population(rng, max(1, initial_ids // 2), new_ids_per_day // 4, days,
                        hex_keys=False)
    hour_effect = rng.normal(0.0, 0.3, 24)
    files, rows, rates, best = {}, {}, {}, {}
    with staged_folder(out, overwrite=overwrite) as stage:
        for day in range(1, days + 1):
            u = rng.choice(users.keys.size, rows_per_day, p=users.weights(day, popularity_drift))
            i = rng.choice(items.keys.size, rows_per_day, p=items.weights(day, popularity_drift))
            hour = rng.integers(0, 24, rows_per_day)
            logit = BIAS + users.effect[u] + items.effect[i] + hour_effect[hour]
            prob = 1.0 / (1.0 + np.exp(-logit))
            click = (rng.random(rows_per_day) < prob).astype(np.int64)
            lines = [f"{c},{day},{h},{k:016x},{it}" for c, h, k, it in
                     zip(click.tolist(), hour.tolist(), users.keys[u].tolist(),
                         items.keys[i].tolist(), strict=True)]
            name = f"day_{day}.csv"
            (stage / name).write_text("click,day,hour,user,item\n" + "\n".join(lines) + "\n")
            np.save(stage / f"day_{day}.prob.npy", prob.astype(np.float32))
            files[day], rows[day] = Path(out) / name, rows_per_day
            rates[day] = float(click.mean())
            best[day] = roc_auc(click, prob.astype(np.float32))
        info: dict[str, Any] = {
            "kind": "days", "days": days, "rows_per_day": rows_per_day,
            "new_ids_per_day": new_ids_per_day, "popularity_drift": popularity_drift,
            "initial_ids": initial_ids, "seed": seed, "label_rate": rates, "best_auc": best,
            "distinct": {"user": int(users.keys.size), "item": int(items.keys.size)},
        }
        write_json_atomic(stage / "synth.json", info)
    return DaysResult(Path(out), files, rows, rates, best,
                      {"user": int(users.keys.size), "item": int(items.keys.size)})


def days_schema(user: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """A schema (as a mapping) for the day logs; ``user``/``item``: the columns' table keys,
    e.g. ``{"hash_size": 4096}`` or ``{"collision": {"kind": "zch", "capacity": 4096}}``."""
    return {
        "name": "synthetic-days", "format": "csv", "header": True, "label": "click",
        "time_column": "day",
        "columns": [
            {"name": "click", "role": "label"},
            {"name": "day", "role": "ignore"},
            {"name": "hour", "role": "sparse", "type": "int", "hash_size": 24},
            {"name": "user", "role": "sparse", "type": "hex", **user},
            {"name": "item", "role": "sparse", "type": "int", **item},
        ],
    }
