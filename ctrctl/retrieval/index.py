"""faiss item indexes over a two-tower model's item vectors, and their recall against exact.

The vectors are unit rows, so inner product is cosine. Kinds, with parameters that follow
the item count N unless given:

| kind  | faiss                          | defaults                                           |
|-------|--------------------------------|----------------------------------------------------|
| flat  | IndexFlatIP (exact)            | -                                                  |
| sq8   | IndexScalarQuantizer, 8 bit    | one INT8 code per component (exact search)         |
| ivf   | IndexIVFFlat                   | nlist 4 sqrt(N) (<= N/39), nprobe nlist/16 (>= 16) |
| hnsw  | IndexHNSWFlat                  | M 32, efConstruction 80, efSearch 256              |
| ivfpq | IndexIVFPQ                     | as ivf; m = dim / 4 sub-quantizers of 8 bits       |

The folder written (``write_index``) holds ``index.faiss``, ``item_ids.npy`` (the item id of
each index row) and ``manifest.json`` (kind, parameters, counts, build time, bytes,
recall@K against exact, each file's sha256, the checkpoint's hash).

Example:
    >>> built = build_index(vectors, "hnsw")
    >>> recall_against_exact(built.index, vectors, queries, k=100)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ctrctl.errors import CheckpointError, ConfigError
from ctrctl.io import file_sha256, read_json_file, staged_folder, write_json_atomic

__all__ = ["INDEX_KINDS", "BuiltIndex", "LoadedIndex", "build_index", "default_params",
           "exact_search", "load_index", "recall_against_exact", "search", "write_index"]

IndexKind = Literal["flat", "sq8", "ivf", "hnsw", "ivfpq"]
INDEX_KINDS: tuple[str, ...] = ("flat", "sq8", "ivf", "hnsw", "ivfpq")

#: faiss wants at least 39 training points per IVF list.
POINTS_PER_LIST = 39


@dataclass
class BuiltIndex:
    """A built index and what it took.

    Attributes:
        index: the faiss index (search parameters set).
        kind, params: what was built.
        seconds: build time (training and adding).
    """

    index: Any
    kind: str
    params: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        """The serialized index's size."""
        import faiss

        return int(faiss.serialize_index(self.index).nbytes)


def default_params(kind: str, count: int, dim: int) -> dict[str, int]:
    """The parameters of ``kind`` that fit ``count`` items of width ``dim``."""
    if kind in ("ivf", "ivfpq"):
        nlist = max(1, min(int(4 * math.sqrt(count)), count // POINTS_PER_LIST))
        # a 16th of the lists (at least 16): recall about 0.95 on clustered vectors
        params = {"nlist": nlist, "nprobe": max(min(nlist, 16), nlist // 16)}
        if kind == "ivfpq":
            m = max(1, dim // 4)
            while dim % m:
                m -= 1
            params.update(m=m, nbits=8 if count >= 256 * POINTS_PER_LIST else 4)
        return params
    if kind == "hnsw":
        # efSearch well above K=100: at 128 recall@100 falls to about 0.9
        return {"M": 32, "efConstruction": 80, "efSearch": 256}
    return {}


def build_index(vectors: np.ndarray, kind: str, params: dict[str, int] | None = None,
                seed: int = 0) -> BuiltIndex:
    """Build a ``kind`` index of ``vectors`` (N, dim) float32; ``params`` override the
    defaults (:func:`default_params`)."""
    import faiss

    if kind not in INDEX_KINDS:
        raise ConfigError(f"unknown index kind {kind!r}", where="--kind",
                          hint=f"use one of {', '.join(INDEX_KINDS)}")
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    count, dim = vectors.shape
    if count == 0:
        raise ConfigError("no item vectors to index", hint="check the dataset's item ids")
    chosen = {**default_params(kind, count, dim), **(params or {})}
    unknown = sorted(set(params or {}) - set(default_params(kind, max(count, 10**6), dim)))
    if unknown:
        raise ConfigError(f"{kind} takes no parameter {unknown[0]!r}", where="--param",
                          hint=f"its parameters: {sorted(default_params(kind, 10**6, dim))}")
    started = time.perf_counter()
    metric = faiss.METRIC_INNER_PRODUCT
    index: Any
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "sq8":
        index = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_8bit, metric)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, chosen["M"], metric)
        index.hnsw.efConstruction = chosen["efConstruction"]
    else:
        quantizer = faiss.IndexFlatIP(dim)
        if kind == "ivf":
            index = faiss.IndexIVFFlat(quantizer, dim, chosen["nlist"], metric)
        else:
            index = faiss.IndexIVFPQ(quantizer, dim, chosen["nlist"], chosen["m"],
                                     chosen["nbits"], metric)
        index.cp.seed = seed
        # k-means on 64 points a list (faiss' default 256): a quarter of the training time
        # at 1M items, for a coarse quantizer that routes as well on clustered vectors
        index.cp.max_points_per_centroid = 64
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors)
    _set_search_params(index, kind, chosen)
    return BuiltIndex(index, kind, chosen, time.perf_counter() - started)


def search(index: Any, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows) of the top ``k`` index rows per query, best first (row -1: none)."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    scores, rows = index.search(queries, min(k, index.ntotal))
    return scores, rows


def exact_search(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """(Q, k) the rows of the exact top ``k`` by inner product (a flat index)."""
    import faiss

    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return search(flat, queries, k)[1]


def recall_against_exact(index: Any, vectors: np.ndarray, queries: np.ndarray, k: int,
                         exact: np.ndarray | None = None) -> float:
    """The share of the exact top ``k`` that the index returns, averaged over queries."""
    exact = exact_search(vectors, queries, k) if exact is None else exact
    found = search(index, queries, k)[1]
    k = exact.shape[1]
    hits = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(exact, found,
                                                                       strict=True))
    return hits / max(len(queries) * k, 1)


# ---- the index folder ----------------------------------------------------------------------
INDEX_FILE = "index.faiss"
IDS_FILE = "item_ids.npy"
MANIFEST_FILE = "manifest.json"
INDEX_FORMAT_VERSION = 1


def write_index(out: str | Path, built: BuiltIndex, item_ids: np.ndarray,
                extra: dict[str, Any], *, overwrite: bool = False) -> dict[str, Any]:
    """Write ``index.faiss``, ``item_ids.npy`` and ``manifest.json`` into a new folder
    ``out`` (staged, then renamed); returns the manifest."""
    import faiss

    with staged_folder(out, overwrite=overwrite) as stage:
        faiss.write_index(built.index, str(stage / INDEX_FILE))
        with open(stage / IDS_FILE, "wb") as f:
            np.save(f, np.asarray(item_ids, dtype=np.int64))
        manifest = {
            "format_version": INDEX_FORMAT_VERSION, "kind": built.kind,
            "params": built.params, "items": int(built.index.ntotal),
            "dim": int(built.index.d), "metric": "inner_product",
            "build_seconds": built.seconds, "bytes": built.bytes,
            "faiss_version": faiss.__version__,
            "files": {name: {"bytes": (stage / name).stat().st_size,
                             "sha256": file_sha256(stage / name)}
                      for name in (INDEX_FILE, IDS_FILE)},
            **extra,
        }
        write_json_atomic(stage / MANIFEST_FILE, manifest)
    return manifest


@dataclass
class LoadedIndex:
    """An index folder read back: the index, the item id of each row, its manifest."""

    index: Any
    item_ids: np.ndarray
    manifest: dict[str, Any]

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, item ids) of the top ``k`` per query (id -1: fewer than k items)."""
        scores, rows = search(self.index, queries, k)
        return scores, np.where(rows >= 0, self.item_ids[np.maximum(rows, 0)], -1)


def load_index(folder: str | Path) -> LoadedIndex:
    """Read an index folder, checking every file against the manifest's sha256.

    Raises:
        CheckpointError: a file is missing or its hash differs.
    """
    import faiss

    folder = Path(folder)
    manifest = read_json_file(folder / MANIFEST_FILE, CheckpointError(
        "not an index folder (no manifest.json)", where=str(folder),
        hint="build one with ctrctl index --checkpoint RUN --out INDEX"))
    for name, entry in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file() or file_sha256(path) != entry["sha256"]:
            raise CheckpointError(f"{name} is missing or differs from its manifest hash",
                                  where=str(path), hint="rebuild the index")
    index = faiss.read_index(str(folder / INDEX_FILE))
    _set_search_params(index, manifest["kind"], manifest["params"])
    ids = np.load(folder / IDS_FILE, allow_pickle=False)
    return LoadedIndex(index, ids, manifest)


def _set_search_params(index: Any, kind: str, params: dict[str, int]) -> None:
    import faiss

    if kind in ("ivf", "ivfpq"):
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]
    if kind == "hnsw":
        index.hnsw.efSearch = params["efSearch"]
