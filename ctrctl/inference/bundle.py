"""The recommendation bundle: a retrieval export (query tower and item index) and a ranker
export (a DLRM) as one folder, one registered version, with lineage to both training runs.

Layout::

    BUNDLE/
      bundle.json    kind ``recommend_bundle``; the sha256 of both exports' manifests (which
                     hash every other file); the item feature the ranker reads the
                     retrieved item id from; the query columns each stage reads; the
                     training run and checkpoint of each model
      retrieval/     the retrieval export (:mod:`ctrctl.inference.retrieval`)
      ranker/        the ranker export (``ctrctl quantize``), unchanged

:func:`load_bundle` checks ``bundle.json`` against both manifests, then each export checks
its own files, so one changed byte anywhere refuses the load.

A request is a query (raw columns, e.g. ``{"user": "196"}``): the query tower embeds it,
the index returns the top ``candidates`` items, the ranker scores those items with the
query as context (the item id as the ranker's ``item_feature`` column), and the top ``k``
by the ranker's score come back with both scores. The ranker reads the retrieval
dataset's item id as its raw item key: they agree where the retrieval schema takes item
keys as they are (``type: int`` with a hash size above the largest key, as
``schemas/movielens_retrieval.yaml`` does).

Example:
    >>> make_bundle("tt-export", "ctr-export", "bundle")
    >>> bundle = load_bundle("bundle")
    >>> bundle.recommend({"user": "196"}, k=10, candidates=200).items
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.errors import CheckpointError, ConfigError
from ctrctl.inference.retrieval import RetrievalModel, load_retrieval
from ctrctl.io import file_sha256, read_json_file, staged_folder, write_json_atomic

__all__ = ["BUNDLE_FILE", "BUNDLE_KIND", "Bundle", "Recommendation", "is_bundle",
           "load_bundle", "load_bundle_retrieval", "make_bundle", "verify_bundle"]

logger = logging.getLogger(__name__)

BUNDLE_KIND = "recommend_bundle"
BUNDLE_FILE = "bundle.json"
MANIFEST = "manifest.json"


def is_bundle(folder: str | Path) -> bool:
    """Whether ``folder`` is a recommendation bundle (holds ``bundle.json``)."""
    return (Path(folder) / BUNDLE_FILE).is_file()


def make_bundle(retrieval: str | Path, ranker: str | Path, out: str | Path, *,
                item_feature: str | None = None, overwrite: bool = False,
                tracker: Any = None, register: str | None = None) -> dict[str, Any]:
    """Put a retrieval export and a ranker export into one bundle folder.

    Args:
        retrieval: a retrieval export (``ctrctl quantize --index``).
        ranker: a ranker export (``ctrctl quantize`` of a DLRM).
        out: the bundle folder to create.
        item_feature: the ranker's column that takes the item id (default: the retrieval
            model's item id feature, which the ranker must read).
        overwrite: replace an existing ``out``.
        tracker: MLflow tracking: a run "bundle" holding the folder as its ``model``.
        register: register that run's model as a new version of this name (tracking on).

    Returns:
        ``bundle.json``'s contents (with ``model_uri`` when registered).

    Raises:
        ConfigError: the ranker does not read the item feature, or reads none of the query's.
    """
    from ctrctl.inference.standalone import verify
    from ctrctl.tracking import Tracker

    retrieval, ranker = Path(retrieval), Path(ranker)
    loaded = load_retrieval(retrieval)             # checks its files
    ranker_manifest = verify(str(ranker))          # checks its files
    item = item_feature or str(loaded.manifest.get("item_id") or "")
    ranker_columns = list(ranker_manifest["input"]["columns"])
    if item not in ranker_columns:
        raise ConfigError(f"the ranker has no input column {item!r} for the item id",
                          where=str(ranker), hint=f"pass --item-feature with one of "
                          f"{', '.join(ranker_columns[:8])}")
    query_columns = list(loaded.encoder.columns)
    context = [c for c in query_columns if c in ranker_columns and c != item]
    info: dict[str, Any] = {
        "kind": BUNDLE_KIND, "item_feature": item, "query_columns": query_columns,
        "ranker_context_columns": context,
        "retrieval": {"manifest_sha256": file_sha256(retrieval / MANIFEST),
                      "training_run_id": loaded.manifest.get("training_run_id"),
                      "checkpoint": loaded.manifest.get("checkpoint"),
                      "index_kind": loaded.manifest.get("index_kind"),
                      "items": loaded.manifest.get("items")},
        "ranker": {"manifest_sha256": file_sha256(ranker / MANIFEST),
                   "training_run_id": ranker_manifest.get("training_run_id"),
                   "checkpoint": ranker_manifest.get("checkpoint")}}
    with staged_folder(out, overwrite=overwrite) as stage:
        shutil.copytree(retrieval, stage / "retrieval")
        shutil.copytree(ranker, stage / "ranker")
        write_json_atomic(stage / BUNDLE_FILE, info)
    tracker = tracker or Tracker()
    if getattr(tracker, "enabled", False):
        info = {**info, **_track(tracker, Path(out), info, register)}
    return info


def _track(tracker: Any, folder: Path, info: dict[str, Any],
           register: str | None) -> dict[str, Any]:
    """Log the bundle as a run's ``model``; register it with both training runs as tags."""
    tags = {"ctrctl.kind": BUNDLE_KIND, "ctrctl.item_feature": info["item_feature"]}
    for stage in ("retrieval", "ranker"):
        for key in ("training_run_id", "checkpoint", "manifest_sha256"):
            tags[f"ctrctl.{stage}.{key}"] = str(info[stage].get(key) or "")
    with tracker.run("bundle", tags=tags) as run:
        run.log_artifact(folder, "model")
        run_id = run.run_id
    out: dict[str, Any] = {"run_id": run_id}
    if register and run_id:
        version = tracker.register_model(register, f"runs:/{run_id}/model", run_id, tags, None)
        out["model_uri"] = f"models:/{register}/{version}"
    return out


@dataclass
class Recommendation:
    """The answer to one query, best first by the ranker.

    Attributes:
        items: (n,) item ids.
        rank_scores: (n,) the ranker's click probabilities.
        retrieval_scores: (n,) the query-item cosine the index returned.
        candidates: how many items the index returned and the ranker scored.
    """

    items: np.ndarray
    rank_scores: np.ndarray
    retrieval_scores: np.ndarray
    candidates: int

    def to_dict(self) -> dict[str, Any]:
        return {"items": self.items.tolist(), "scores": self.rank_scores.tolist(),
                "retrieval_scores": self.retrieval_scores.tolist(),
                "candidates": self.candidates}


class Bundle:
    """A loaded bundle: :meth:`retrieve` then :meth:`rank`, or both in :meth:`recommend`.

    Attributes:
        folder, info: the bundle and its ``bundle.json``.
        retrieval: the :class:`~ctrctl.inference.retrieval.RetrievalModel`.
        ranker: the ranker's loaded artifact (its ``score_columns``).
    """

    def __init__(self, folder: Path, info: dict[str, Any], retrieval: RetrievalModel,
                 ranker: Any) -> None:
        self.folder = folder
        self.info = info
        self.retrieval = retrieval
        self.ranker = ranker
        self.item_feature = str(info["item_feature"])
        self.query_columns = list(info["query_columns"])
        self.context_columns = list(info["ranker_context_columns"])

    def retrieve(self, query: Mapping[str, Any], candidates: int
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(item ids, cosines) of the index's top ``candidates`` for one raw query."""
        columns = {c: [query[c]] for c in self.query_columns if c in query}
        scores, items = self.retrieval.retrieve(columns, candidates)
        keep = items[0] >= 0
        return items[0][keep], scores[0][keep]

    def ranker_columns(self, query: Mapping[str, Any], items: np.ndarray
                       ) -> tuple[dict[str, list[Any]], dict[str, Any]]:
        """(candidate columns, context) of a ``/v1/rank`` call scoring ``items``."""
        context = {c: query[c] for c in self.context_columns if c in query}
        return {self.item_feature: [str(int(i)) for i in items]}, context

    def rank(self, query: Mapping[str, Any], items: np.ndarray) -> np.ndarray:
        """The ranker's scores of ``items`` with the query as context (item order)."""
        columns, context = self.ranker_columns(query, items)
        n = len(items)
        return np.asarray(self.ranker.score_columns(
            {**columns, **{c: [v] * n for c, v in context.items()}}, n))

    def recommend(self, query: Mapping[str, Any], k: int, candidates: int) -> Recommendation:
        """The top ``k`` of the index's top ``candidates``, by the ranker's score."""
        items, cosines = self.retrieve(query, candidates)
        scores = self.rank(query, items)
        return top_k(items, scores, cosines, k)


def top_k(items: np.ndarray, scores: np.ndarray, cosines: np.ndarray, k: int
          ) -> Recommendation:
    """The ``k`` best by ``scores`` (ties: retrieval order, which is stable)."""
    order = np.argsort(-scores, kind="stable")[:k]
    return Recommendation(items[order], scores[order], cosines[order], len(items))


def load_bundle(folder: str | Path) -> Bundle:
    """Load a bundle after checking ``bundle.json`` against both exports' manifests (and
    each export its own files).

    Raises:
        CheckpointError: not a bundle, or a file changed since it was made.
    """
    from ctrctl.inference.export import load_artifact

    info, retrieval = load_bundle_retrieval(folder)
    return Bundle(Path(folder), info, retrieval, load_artifact(Path(folder) / "ranker"))


def load_bundle_retrieval(folder: str | Path) -> tuple[dict[str, Any], RetrievalModel]:
    """``bundle.json`` (checked against both manifests) and the retrieval stage, for a
    server that loads the ranker (``BUNDLE/ranker``) as any export.

    Raises:
        CheckpointError: not a bundle, or a file changed since it was made.
    """
    info = verify_bundle(folder)
    return info, load_retrieval(Path(folder) / "retrieval")


def verify_bundle(folder: str | Path) -> dict[str, Any]:
    """``bundle.json``, after checking it is a bundle's and names the sha256 of both
    exports' manifests (each export checks its own files against its manifest when loaded).

    Raises:
        CheckpointError: not a bundle, or a manifest changed since the bundle was made.
    """
    folder = Path(folder)
    if not is_bundle(folder):
        raise CheckpointError("not a recommendation bundle (no bundle.json)", where=str(folder),
                              hint="make one with ctrctl bundle --retrieval EXPORT --ranker "
                                   "EXPORT --out BUNDLE")
    info = read_json_file(folder / BUNDLE_FILE)
    if not isinstance(info, dict) or info.get("kind") != BUNDLE_KIND:
        raise CheckpointError(f"bundle.json is not of kind {BUNDLE_KIND}", where=str(folder))
    for part in ("retrieval", "ranker"):
        expected = info.get(part, {}).get("manifest_sha256")
        path = folder / part / MANIFEST
        if not path.is_file() or file_sha256(path) != expected:
            raise CheckpointError(f"{part}/{MANIFEST} does not match its sha256 in "
                                  f"{BUNDLE_FILE}: the bundle was changed after it was made",
                                  where=str(path), hint="make the bundle again")
    return info
