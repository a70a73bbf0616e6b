"""faiss indexes against exact search on synthetic factors; the index folder's hashes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ctrctl.errors import CheckpointError, ConfigError
from ctrctl.retrieval.index import (
    build_index,
    default_params,
    exact_search,
    load_index,
    recall_against_exact,
    write_index,
)
from ctrctl.retrieval.synthetic import clustered_factors

ITEMS = clustered_factors(10_000, 32, seed=1, clusters=128)
QUERIES = clustered_factors(300, 32, seed=2, clusters=128)  # the same centres: seed + 7


@pytest.fixture(scope="module")
def exact() -> np.ndarray:
    return exact_search(ITEMS, QUERIES, 100)


def test_exact_search_is_the_brute_force_top_k(exact: np.ndarray) -> None:
    scores = QUERIES[:5] @ ITEMS.T
    brute = np.argsort(-scores, axis=1, kind="stable")[:, :100]
    for a, b in zip(exact[:5], brute, strict=True):
        assert len(set(a.tolist()) & set(b.tolist())) >= 99  # float ties at the cut


@pytest.mark.parametrize(("kind", "params", "floor"), [
    ("flat", None, 1.0),
    ("sq8", None, 0.95),
    ("hnsw", None, 0.95),
    ("ivf", None, 0.90),
    ("ivf", {"nprobe": 10_000}, 1.0),   # every list probed: exhaustive
    pytest.param("ivfpq", None, 0.30, marks=pytest.mark.slow),  # 8 bytes an item: coarse
])
def test_index_recall_against_exact(kind: str, params: dict[str, int] | None, floor: float,
                                    exact: np.ndarray) -> None:
    built = build_index(ITEMS, kind, params)
    if params and "nprobe" in params:
        built = build_index(ITEMS, kind, {"nprobe": built.params["nlist"]})
    recall = recall_against_exact(built.index, ITEMS, QUERIES, 100, exact)
    assert recall >= floor - 1e-9, (kind, built.params, recall)
    if kind == "flat":
        assert recall == 1.0


def test_defaults_follow_the_item_count() -> None:
    small, large = default_params("ivf", 1_000, 64), default_params("ivf", 1_000_000, 64)
    assert small["nlist"] <= 1_000 // 39 and large["nlist"] == 4000
    assert default_params("ivfpq", 1_000_000, 64)["m"] == 16
    with pytest.raises(ConfigError, match="no parameter"):
        build_index(ITEMS[:100], "hnsw", {"nlist": 3})
    with pytest.raises(ConfigError, match="unknown index kind"):
        build_index(ITEMS[:100], "lsh")


def test_index_folder_round_trips_and_checks_its_hashes(tmp_path: Path) -> None:
    built = build_index(ITEMS[:1000], "hnsw")
    ids = np.arange(1000, 2000)
    manifest = write_index(tmp_path / "idx", built, ids, {"recall@100": 1.0})
    assert manifest["items"] == 1000 and manifest["files"]["index.faiss"]["sha256"]
    loaded = load_index(tmp_path / "idx")
    scores, found = loaded.search(ITEMS[:3], 5)
    assert found[:, 0].tolist() == [1000, 1001, 1002]  # each item finds itself, as its id
    with open(tmp_path / "idx" / "item_ids.npy", "ab") as f:
        f.write(b"\0")
    with pytest.raises(CheckpointError, match="item_ids.npy"):
        load_index(tmp_path / "idx")
