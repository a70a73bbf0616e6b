"""The retrieval export: a two-tower model's query tower with quantized tables, and its
item index, as one folder whose files are hashed in a manifest and verified at load.

``export_retrieval`` (``ctrctl quantize`` of a two-tower checkpoint) writes::

    query_tower.pt    the query tower's state: INT8 (or --dtype) tables in FBGEMM's row
                      layout (fp16 scale and bias per row), the MLP in FP32
    tower.json        the tables (name, rows, dim, dtype, features) and the MLP's widths
    input.json        the input contract of the query features (raw column -> id), as the
                      ranker's export states it; vocab/ holds vocabulary-mode maps
    index.faiss       the item index (``ctrctl index``), item_ids.npy its rows' item ids,
    item_ids.npy      index.json its manifest (kind, parameters, recall against exact)
    index.json
    manifest.json     kind ``two_tower_retrieval``, each file's sha256, the checkpoint, the
                      index's checkpoint hash, bytes, and the recall cost of the quantized
                      tower (top-K overlap with the FP32 tower over the eval queries)

``load_retrieval`` verifies every hash and returns a :class:`RetrievalModel`: raw query
rows -> unit vectors -> the index's top K item ids.

Example:
    >>> exported = export_retrieval("runs/tt", "index", "export", dtype="int8")
    >>> model = load_retrieval("export")
    >>> scores, items = model.retrieve({"user": ["196"]}, 100)     # (1, 100) each
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ctrctl.errors import CheckpointError, ConfigError
from ctrctl.io import file_sha256, read_json_file, staged_folder, tree_sha256, write_json_atomic
from ctrctl.modules.mlp import MLP
from ctrctl.modules.quant_embedding import QuantEmbeddingBagCollection, QuantTableSpec

__all__ = ["EXPORT_KIND", "ExportedRetrieval", "QueryTower", "RetrievalModel",
           "export_retrieval", "load_retrieval", "quantize_query_tower"]

logger = logging.getLogger(__name__)

EXPORT_KIND = "two_tower_retrieval"
#: The files an export holds besides the manifest (vocab/*.json are added when present).
EXPORT_FILES = ("query_tower.pt", "tower.json", "input.json", "index.faiss",
                "item_ids.npy", "index.json")
#: Eval queries the quantized tower's recall cost is measured on (at most).
COST_QUERIES = 2000
#: The cut-off of that measure.
COST_K = 100


class QueryTower(nn.Module):
    """A query tower for serving: quantized tables, the trained MLP, unit outputs.

    Input is the TBE layout over ``features`` (ids feature after feature, ``offsets`` of
    ``F * B + 1`` entries); output (B, E) unit rows, as the trained tower gives.
    """

    def __init__(self, tables: list[QuantTableSpec], layers: list[int]) -> None:
        super().__init__()
        self.tables = tables
        self.layers = layers
        self.ebc = QuantEmbeddingBagCollection(tables, backend="auto")
        self.features = self.ebc.feature_names()
        self.mlp = MLP(self.ebc.total_D, layers, final_activation=False, kernel="torch")

    @torch.no_grad()
    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        pooled = self.ebc(indices, offsets)                 # (B, F * D)
        return F.normalize(self.mlp(pooled), dim=-1)        # (B, E)

    def embed_ids(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """(B, E) from ids feature after feature and (F * B,) key-major lengths."""
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        return self(ids.to(torch.int64), offsets)

    def spec(self) -> dict[str, Any]:
        return {"tables": [t.as_dict() for t in self.tables], "layers": self.layers}


def quantize_query_tower(model: nn.Module, dtype: str = "int8") -> QueryTower:
    """The query tower of a trained two-tower model with ``dtype`` tables (row-wise)."""
    from ctrctl.models.two_tower import two_tower_of

    tower = two_tower_of(model).query_tower
    tables = [QuantTableSpec(c.name, c.num_embeddings, c.embedding_dim, dtype,
                             tuple(c.feature_names))
              for c in tower.ebc.embedding_bag_configs()]
    weights = {name: w.detach().float().cpu()
               for name, w in tower.ebc.embedding_bag_weights().items()}
    layers = [layer.out_features for layer in tower.mlp.modules()
              if isinstance(layer, nn.Linear)]
    quantized = QueryTower(tables, layers)
    quantized.ebc.load_float_weights(weights)
    quantized.mlp.load_state_dict(tower.mlp.state_dict())
    return quantized.eval()


@dataclass
class ExportedRetrieval:
    """What :func:`export_retrieval` wrote.

    Attributes:
        folder: the export.
        manifest: its manifest.
        fp32_bytes, quantized_bytes: the query tower's tables before and after.
        model_uri: the MLflow model the export was logged as (tracking on), else None.
    """

    folder: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    fp32_bytes: int = 0
    quantized_bytes: int = 0
    model_uri: str | None = None


def export_retrieval(checkpoint: str | Path, index: str | Path, out: str | Path, *,
                     dtype: str = "int8", dataset: str | Path | None = None,
                     overwrite: bool = False, tracker: Any = None,
                     log_model: bool = False) -> ExportedRetrieval:
    """Quantize a two-tower checkpoint's query tower and write it with ``index``.

    Args:
        checkpoint: the training run (or a checkpoint folder in it).
        index: an index folder of the same checkpoint (``ctrctl index``).
        out: the export folder to create.
        dtype: the tables' type (``int8``, ``int4``, ``fp16``, ...).
        dataset: the training dataset (default: the one the checkpoint records).
        overwrite: replace an existing ``out``.
        tracker: MLflow tracking (one run "quantize"); None tracks nothing.
        log_model: log the export's files as the run's ``model`` (to register it).

    Raises:
        CheckpointError: the index was built from another checkpoint.
    """
    from ctrctl import checkpoint as ckpt
    from ctrctl.data.manifest import DatasetManifest
    from ctrctl.inference.export import _vocabulary_files, input_contract
    from ctrctl.models.scoring import load_model
    from ctrctl.models.two_tower import two_tower_of
    from ctrctl.tracking import Tracker

    tracker = tracker or Tracker()
    started = time.perf_counter()
    meta = ckpt.read_metadata(checkpoint)
    index = Path(index)
    index_manifest = read_json_file(index / "manifest.json")
    if index_manifest.get("checkpoint_sha256") != tree_sha256(meta.path):
        raise CheckpointError("the index was built from another checkpoint",
                              where=str(index), hint=f"rebuild it: ctrctl index "
                              f"--checkpoint {checkpoint} --out {index} --overwrite")
    model, manifest, _ = load_model(checkpoint, "cpu")
    assert isinstance(manifest, DatasetManifest)
    folder = Path(dataset) if dataset is not None else Path(meta.extra.get("dataset", ""))
    tower = quantize_query_tower(model, dtype)
    fp32_bytes = sum(t.num_embeddings * t.embedding_dim * 4 for t in tower.tables)
    quantized_bytes = sum(t.nbytes for t in tower.tables)
    cost = _recall_cost(model, tower, folder, manifest, index_manifest)
    with tracker.run("quantize") as run, staged_folder(out, overwrite=overwrite) as stage:
        torch.save(tower.state_dict(), stage / "query_tower.pt")
        write_json_atomic(stage / "tower.json", tower.spec())
        vocab = _vocabulary_files(manifest, folder if folder.is_dir() else None, stage)
        write_json_atomic(stage / "input.json", input_contract(manifest, tower.features, vocab))
        for name in ("index.faiss", "item_ids.npy"):
            shutil.copyfile(index / name, stage / name)
        shutil.copyfile(index / "manifest.json", stage / "index.json")
        files = sorted([*EXPORT_FILES, *vocab.values()])
        run_id = meta.extra.get("mlflow_run_id") or meta.extra.get("run_id")
        out_manifest = {
            "kind": EXPORT_KIND, "dtype": dtype, "checkpoint": str(meta.path),
            "training_run_id": str(run_id) if run_id else None,
            "item_id": two_tower_of(model).item_id,
            "checkpoint_sha256": index_manifest["checkpoint_sha256"],
            "index_kind": index_manifest.get("kind"), "items": index_manifest.get("items"),
            "bytes.fp32": fp32_bytes, "bytes.quantized": quantized_bytes, **cost,
            "seconds": time.perf_counter() - started,
            "files": {name: file_sha256(stage / name) for name in files}}
        write_json_atomic(stage / "manifest.json", out_manifest)
        run.log_params({"checkpoint": str(meta.path), "dtype": dtype, "kind": EXPORT_KIND,
                        "index": str(index)})
        run.log_metrics({"bytes.fp32": float(fp32_bytes),
                         "bytes.quantized": float(quantized_bytes),
                         **{k: float(v) for k, v in cost.items()}})
        quantize_run = getattr(run, "run_id", None)
    exported = ExportedRetrieval(Path(out), out_manifest, fp32_bytes, quantized_bytes)
    if log_model and quantize_run:
        logged = tracker.open(quantize_run)
        for name in [*files, "manifest.json"]:
            sub = str(Path("model") / Path(name).parent).rstrip("/.")
            logged.log_artifact(Path(out) / name, sub)
        exported.model_uri = f"runs:/{quantize_run}/model"
    logger.info("query tower: %d -> %d table bytes (%s); top-%d overlap with FP32 %.4f",
                fp32_bytes, quantized_bytes, dtype, COST_K, cost.get(f"overlap@{COST_K}", 1.0))
    return exported


def _recall_cost(model: nn.Module, tower: QueryTower, folder: Path, manifest: Any,
                 index_manifest: dict[str, Any]) -> dict[str, float]:
    """The quantized tower against the FP32 one on up to :data:`COST_QUERIES` eval queries:
    the share of each query's exact top-K items they agree on, and the vectors' cosine."""
    from ctrctl.models.two_tower import embed, evaluation_queries, item_catalogue, kjt_from_frame

    if not (folder / "manifest.json").is_file():
        return {}
    split = str(index_manifest.get("recall_split") or "test")
    queries, _ = evaluation_queries(folder, manifest, split)
    queries = queries.head(COST_QUERIES)
    if len(queries) == 0:
        return {}
    items = embed(model, item_catalogue(folder, manifest).features, "item")   # (N, E)
    exact = embed(model, queries, "query")                                     # (Q, E)
    kjt = kjt_from_frame(queries, tower.features)
    quantized = tower.embed_ids(kjt.values(), kjt.lengths())                  # (Q, E)
    k = min(COST_K, len(items))
    top_exact = (exact @ items.T).topk(k, dim=1).indices
    top_quant = (quantized @ items.T).topk(k, dim=1).indices
    overlap = np.mean([len(set(a) & set(b)) / k for a, b in
                       zip(top_exact.tolist(), top_quant.tolist(), strict=True)])
    cosine = float((exact * quantized).sum(1).mean())
    return {f"overlap@{COST_K}": float(overlap), "cosine": cosine,
            "cost_queries": float(len(queries))}


class RetrievalModel:
    """A loaded retrieval export: raw query rows -> vectors -> the index's top K items.

    Attributes:
        folder: the export.
        manifest: its manifest.
        tower: the quantized :class:`QueryTower`.
        index: the faiss index; ``item_ids`` (rows,) its rows' item ids.
        contract: the query features' input contract.
    """

    def __init__(self, folder: Path, manifest: dict[str, Any], tower: QueryTower,
                 index: Any, item_ids: np.ndarray, contract: dict[str, Any],
                 vocabularies: dict[str, dict[str, int]]) -> None:
        from ctrctl.inference.standalone_encoder import Encoder

        self.folder = folder
        self.manifest = manifest
        self.tower = tower
        self.index = index
        self.item_ids = item_ids
        self.contract = contract
        self.encoder = Encoder(contract, vocabularies, _string_hasher)

    def embed(self, columns: dict[str, Any], rows: int) -> torch.Tensor:
        """(rows, E) unit query vectors of raw columns (feature -> ``rows`` values)."""
        _, ids, lengths = self.encoder.encode(columns, rows)
        return self.tower.embed_ids(torch.from_numpy(ids), torch.from_numpy(lengths))

    def search(self, vectors: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, item ids), each (rows, k'), k' = min(k, items), best first."""
        k = min(int(k), int(self.index.ntotal))
        scores, rows = self.index.search(np.ascontiguousarray(vectors.numpy(), np.float32), k)
        return scores, np.where(rows >= 0, self.item_ids[np.maximum(rows, 0)], -1)

    def retrieve(self, columns: dict[str, Any], k: int, rows: int = 1
                 ) -> tuple[np.ndarray, np.ndarray]:
        """The top ``k`` items of raw query rows: (scores, item ids)."""
        return self.search(self.embed(columns, rows), k)


def _string_hasher(feature: dict[str, Any]) -> Any:
    """Raw strings -> ids as the preprocess step hashed them (polars, same version)."""
    import polars as pl

    from ctrctl.data.transforms import encode_hash

    name, size = feature["name"], int(feature["num_embeddings"])

    def hash_ids(texts: list[str]) -> list[int]:
        frame = pl.DataFrame({name: texts}, schema={name: pl.String})
        return frame.select(encode_hash(name, "string", size, False))[name].to_list()

    return hash_ids


def load_retrieval(folder: str | Path) -> RetrievalModel:
    """Load a retrieval export after checking every file's sha256 against its manifest.

    Raises:
        CheckpointError: not a retrieval export, a file missing or changed.
    """
    import faiss

    folder = Path(folder)
    manifest = read_json_file(folder / "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("kind") != EXPORT_KIND:
        raise CheckpointError("not a retrieval export (kind two_tower_retrieval)",
                              where=str(folder), hint="export one with ctrctl quantize "
                              "--checkpoint TWO_TOWER_RUN --index INDEX --out EXPORT")
    for name, digest in dict(manifest.get("files", {})).items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{name} is missing", where=str(folder),
                                  hint="export it again")
        if file_sha256(path) != digest:
            raise CheckpointError(f"{name} does not match its sha256 in manifest.json: the "
                                  "export was changed after it was written",
                                  where=str(path), hint="export it again")
    spec = read_json_file(folder / "tower.json")
    tables = [QuantTableSpec(t["name"], int(t["num_embeddings"]), int(t["embedding_dim"]),
                             t["dtype"], tuple(t["feature_names"])) for t in spec["tables"]]
    tower = QueryTower(tables, list(spec["layers"]))
    tower.load_state_dict(torch.load(folder / "query_tower.pt", weights_only=True))
    tower.eval()
    index = faiss.read_index(str(folder / "index.faiss"))
    index_manifest = read_json_file(folder / "index.json")
    _set_search_params(index, str(index_manifest.get("kind")),
                       dict(index_manifest.get("params", {})))
    contract = read_json_file(folder / "input.json")
    vocabularies = {f["name"]: read_json_file(folder / f["vocabulary"])
                    for f in contract["sparse"] if f.get("vocabulary")}
    item_ids = np.load(folder / "item_ids.npy", allow_pickle=False)
    if len(item_ids) != index.ntotal:
        raise ConfigError(f"item_ids.npy holds {len(item_ids)} ids for {index.ntotal} "
                          "index rows", where=str(folder), hint="export it again")
    return RetrievalModel(folder, manifest, tower, index, item_ids, contract, vocabularies)


def _set_search_params(index: Any, kind: str, params: dict[str, int]) -> None:
    """The search-time parameters faiss does not keep in the file (``nprobe``)."""
    import faiss

    if kind in ("ivf", "ivfpq") and "nprobe" in params:
        faiss.extract_index_ivf(index).nprobe = int(params["nprobe"])
    if kind == "hnsw" and "efSearch" in params:
        index.hnsw.efSearch = int(params["efSearch"])
