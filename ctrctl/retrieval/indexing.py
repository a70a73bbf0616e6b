"""``ctrctl index``: embed every item of a two-tower checkpoint and build a faiss index.

The items are the catalogue of the dataset the model was trained on (every item id with an
interaction, :func:`~ctrctl.models.two_tower.item_catalogue`); the recall against exact
search is measured on the query vectors of the dataset's test (else val) users.

Example:
    >>> result = index_checkpoint("runs/tt", "index", kind="hnsw")
    >>> result["recall@100"], result["build_seconds"], result["bytes"]
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ctrctl import checkpoint as ckpt
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import DatasetError
from ctrctl.io import tree_sha256
from ctrctl.models.scoring import load_model
from ctrctl.models.two_tower import embed, evaluation_queries, item_catalogue
from ctrctl.retrieval.index import (
    build_index,
    exact_search,
    recall_against_exact,
    search,
    write_index,
)

__all__ = ["index_checkpoint", "trained_dataset"]

logger = logging.getLogger(__name__)

#: Queries the recall against exact is measured on (at most).
RECALL_QUERIES = 2000


def trained_dataset(checkpoint: str | Path, dataset: str | Path | None) -> tuple[Path,
                                                                                 DatasetManifest]:
    """``dataset``, or the one the checkpoint was trained on, with its manifest; refuses a
    dataset whose tables differ from the model's."""
    meta = ckpt.read_metadata(checkpoint)
    folder = Path(dataset if dataset is not None else meta.extra.get("dataset", ""))
    manifest = DatasetManifest.load(folder)
    trained = DatasetManifest.from_dict(meta.extra["manifest"], where=str(meta.path))
    if manifest.table_sizes() != trained.table_sizes():
        raise DatasetError("the dataset's tables differ from the model's", where=str(folder),
                           hint="pass --dataset with the dataset the model was trained on")
    return folder, manifest


def index_checkpoint(checkpoint: str | Path, out: str | Path, *, kind: str = "hnsw",
                     params: dict[str, int] | None = None, dataset: str | Path | None = None,
                     k: int = 100, overwrite: bool = False) -> dict[str, Any]:
    """Embed the catalogue with the checkpoint's item tower, index it, write ``out``.

    Args:
        checkpoint: a two-tower training run (or a checkpoint folder in it).
        out: the index folder to create.
        kind, params: see :mod:`ctrctl.retrieval.index`.
        dataset: the dataset of the items (default: the one the model was trained on).
        k: the cut-off of the recall against exact.
        overwrite: replace an existing ``out``.

    Returns:
        The index manifest: kind, params, items, build_seconds, bytes, ``recall@K``, the
        queries/s of exact and index search on one thread, and the hashes.
    """
    import faiss

    model, _, _ = load_model(checkpoint)
    folder, manifest = trained_dataset(checkpoint, dataset)
    catalogue = item_catalogue(folder, manifest)
    vectors = embed(model, catalogue.features, "item").numpy()
    split = "test" if "test" in manifest.splits else "val"
    queries_frame, _ = evaluation_queries(folder, manifest, split)
    queries = embed(model, queries_frame.head(RECALL_QUERIES), "query").numpy()
    if len(queries) == 0:
        queries = vectors[:RECALL_QUERIES]
    built = build_index(vectors, kind, params)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        exact_qps, exact = _timed(lambda: exact_search(vectors, queries, k), len(queries))
        index_qps, _ = _timed(lambda: search(built.index, queries, k), len(queries))
        recall = recall_against_exact(built.index, vectors, queries, k, exact)
    finally:
        faiss.omp_set_num_threads(threads)
    meta = ckpt.read_metadata(checkpoint)
    extra = {
        f"recall@{k}": recall, "recall_queries": len(queries), "recall_split": split,
        "exact_qps_1thread": exact_qps, "index_qps_1thread": index_qps,
        "checkpoint": str(meta.path), "checkpoint_sha256": tree_sha256(meta.path),
        "dataset": str(folder), "manifest_hash": manifest.content_hash(),
    }
    result = write_index(out, built, catalogue.ids.numpy(), extra, overwrite=overwrite)
    logger.info("%s index of %d items in %.2f s: recall@%d %.4f against exact", kind,
                len(vectors), built.seconds, k, recall)
    return result


def _timed(fn: Any, count: int) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return count / max(time.perf_counter() - started, 1e-9), out


