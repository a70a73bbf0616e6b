"""Interaction logs from planted factors: the best achievable recall is known.

Each user u and item i get a unit vector (``dim`` wide); item i also gets a popularity bias.
User u picks ``per_user`` distinct items with probability proportional to
``exp(<U_u, V_i> / temperature + bias_i)`` (Gumbel top-k draws them without replacement),
at increasing times in a random order. The log is written as ``interactions.tsv``
(user, item, rating 5, Unix time; ids from 1, as MovieLens' ``u.data``) with a
``schema.yaml`` for it, so ``ctrctl preprocess`` splits it leave-last-out.

``synth.json`` holds the oracle's recall@K: the test item (each user's last) ranked by the
true scores among the items the user has not interacted with before.

Example:
    >>> result = synthesize_two_tower(Path("logs"), users=2000, items=5000, per_user=20)
    >>> result["oracle"]["recall@100"]
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ctrctl.errors import ConfigError
from ctrctl.io import staged_folder, write_json_atomic, write_text_atomic

__all__ = ["SYNTH_KS", "clustered_factors", "plant_factors", "synthesize_two_tower"]

#: The cut-offs of the oracle's recall in synth.json.
SYNTH_KS = (10, 50, 100)


def plant_factors(count: int, dim: int, seed: int) -> np.ndarray:
    """``count`` unit vectors of width ``dim`` (float32), uniform on the sphere."""
    rng = np.random.default_rng(seed)
    factors = rng.standard_normal((count, dim), dtype=np.float32)
    factors /= np.linalg.norm(factors, axis=1, keepdims=True)
    return factors


def clustered_factors(count: int, dim: int, seed: int, clusters: int = 256,
                      spread: float = 0.5) -> np.ndarray:
    """``count`` unit vectors around ``clusters`` random centres (as learned item vectors
    group by genre or taste): centre + ``spread`` x a unit-variance noise per component /
    sqrt(dim), renormalised."""
    rng = np.random.default_rng(seed)
    centres = plant_factors(clusters, dim, seed + 7)
    out = np.empty((count, dim), dtype=np.float32)
    for start in range(0, count, 65_536):
        n = min(65_536, count - start)
        noise = rng.standard_normal((n, dim), dtype=np.float32) * (spread / np.sqrt(dim))
        block = centres[rng.integers(0, clusters, n)] + noise
        out[start:start + n] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def synthesize_two_tower(
    out: str | Path,
    *,
    users: int = 2000,
    items: int = 5000,
    per_user: int = 20,
    dim: int = 16,
    temperature: float = 0.1,
    popularity: float = 1.0,
    seed: int = 0,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write ``interactions.tsv``, ``schema.yaml`` and ``synth.json`` into ``out``.

    Args:
        out: the folder to create.
        users, items: how many of each (ids 1..users, 1..items).
        per_user: interactions per user (at least 3: train, val and test).
        dim: width of the planted factors.
        temperature: the softmax temperature of a user's choice (lower: more predictable).
        popularity: standard deviation of the items' log-popularity bias.
        seed: the same arguments give the same bytes.
        overwrite: replace an existing ``out``.

    Returns:
        The contents of ``synth.json``.
    """
    if per_user < 3 or per_user > items:
        raise ConfigError(f"per_user must be in [3, items], not {per_user}",
                          hint="each user needs a train, a val and a test interaction")
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    user_f = plant_factors(users, dim, seed + 1)
    item_f = plant_factors(items, dim, seed + 2)
    bias = (popularity * rng.standard_normal(items)).astype(np.float32)
    chosen = np.empty((users, per_user), dtype=np.int64)
    hits = {k: 0 for k in SYNTH_KS}
    for start in range(0, users, 1024):
        logits = user_f[start:start + 1024] @ item_f.T / temperature + bias  # (B, items)
        gumbel = rng.gumbel(size=logits.shape).astype(np.float32)
        picked = np.argsort(-(logits + gumbel), axis=1)[:, :per_user]      # (B, per_user)
        order = rng.permuted(picked, axis=1)  # the time order of a user's picks
        chosen[start:start + len(order)] = order
        seen = logits.copy()
        np.put_along_axis(seen, order[:, :-1], -np.inf, axis=1)  # rank among unseen items
        target = np.take_along_axis(logits, order[:, -1:], axis=1)
        rank = (seen > target).sum(axis=1)
        for k in SYNTH_KS:
            hits[k] += int((rank < k).sum())
    user_ids = np.repeat(np.arange(1, users + 1), per_user)
    times = np.tile(np.arange(per_user), users) + 1_000_000_000
    lines = np.char.add(np.char.add(user_ids.astype(str), "\t"),
                        np.char.add((chosen.ravel() + 1).astype(str), "\t5\t"))
    lines = np.char.add(lines, times.astype(str))
    result: dict[str, Any] = {
        "format": "two_tower", "users": users, "items": items, "per_user": per_user,
        "dim": dim, "temperature": temperature, "popularity": popularity, "seed": seed,
        "rows": users * per_user,
        "oracle": {f"recall@{k}": hits[k] / users for k in SYNTH_KS},
    }
    with staged_folder(out, overwrite=overwrite) as staging:
        write_text_atomic(staging / "interactions.tsv", "\n".join(lines.tolist()) + "\n")
        write_text_atomic(staging / "schema.yaml", yaml.safe_dump(_schema(users, items)))
        result["seconds"] = time.perf_counter() - started
        write_json_atomic(staging / "synth.json", result)
    return result


def _schema(users: int, items: int) -> dict[str, Any]:
    return {
        "name": "synthetic_two_tower", "format": "tsv", "header": False,
        "label": {"threshold": 4.0},
        "interactions": {"user": "user", "time": "timestamp", "positives": "all"},
        "columns": [
            {"name": "user", "role": "query", "type": "int", "hash_size": users + 1},
            {"name": "item", "role": "item_id", "type": "int", "hash_size": items + 1},
            {"name": "rating", "role": "label"},
            {"name": "timestamp", "role": "ignore"},
        ],
    }
