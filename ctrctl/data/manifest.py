"""``manifest.json``: what a preprocessed dataset holds and how it was made.

A dataset folder looks like::

    dataset/
      manifest.json          this file's format
      train/part-00000.parquet ...   one folder per split: label, dense float32, sparse int64
      val/...  test/...              (list<int64> for multi-hot features)
      vocab/C1.parquet ...   vocabularies of features in vocabulary mode

A schema with a ``time_column`` adds the column ``__time`` (:data:`TIME_COLUMN`) to every
split: each row's data time in days (float64), which ``ttl`` managed-collision tables evict by.

Every later step reads table sizes from here (``SparseFeature.num_embeddings``), so the
manifest is validated on load and a wrong or newer format is a clear error.

Example:
    >>> m = DatasetManifest.load("dataset")
    >>> m.table_sizes()          # {'C1': 1000000, 'C2': 583, ...}
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.errors import DatasetError, FormatError
from ctrctl.io import inside, json_sha256, path_name_problem, read_json_file, write_json_atomic

FORMAT = "ctrctl.dataset"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "val", "test")
#: The Parquet column holding each row's data time in days (schemas with a ``time_column``).
TIME_COLUMN = "__time"


@dataclass(frozen=True)
class DenseFeature:
    """A dense feature after its transform, with statistics over the training split."""

    name: str
    mean: float = 0.0
    std: float = 0.0
    min: float = 0.0
    max: float = 0.0
    missing_rate: float = 0.0


@dataclass(frozen=True)
class SparseFeature:
    """A categorical feature: ids in ``[0, num_embeddings)``.

    Attributes:
        mode: ``hash`` (raw value mod ``hash_size``), ``vocab`` (contiguous ids from a
            vocabulary built on the training split; id 0 is out-of-vocabulary) or ``zch``
            (raw 64-bit keys, mapped to rows by the model's managed-collision remapper).
        num_embeddings: the embedding table's row count for this feature.
        cardinality: distinct ids seen in the training split after the transform.
        multi_hot: values are lists (``list<int64>``) rather than one id per row.
        mean_length: average ids per row (1.0 for one-hot): the pooling factor.
        collision: ``zch`` only: the schema's ``collision`` entry (capacity, eviction,
            ttl_days, admit_min_count); ``num_embeddings`` is its capacity.
    """

    name: str
    mode: str
    num_embeddings: int
    cardinality: int = 0
    hash_size: int | None = None
    min_count: int | None = None
    multi_hot: bool = False
    mean_length: float = 1.0
    collision: dict[str, Any] | None = None


@dataclass(frozen=True)
class SplitInfo:
    rows: int
    label_rate: float
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class DatasetManifest:
    """The parsed ``manifest.json`` of a dataset folder."""

    label: str
    dense: tuple[DenseFeature, ...]
    sparse: tuple[SparseFeature, ...]
    splits: dict[str, SplitInfo]
    schema: dict[str, Any] = field(default_factory=dict)
    schema_hash: str = ""
    inputs: tuple[dict[str, Any], ...] = ()
    transforms: dict[str, Any] = field(default_factory=dict)
    bad_rows: dict[str, int] = field(default_factory=dict)
    follows: dict[str, Any] | None = None
    created: str = ""
    format_version: int = FORMAT_VERSION

    # ---- queries -------------------------------------------------------------------
    @property
    def dense_names(self) -> list[str]:
        return [f.name for f in self.dense]

    @property
    def sparse_names(self) -> list[str]:
        return [f.name for f in self.sparse]

    @property
    def needs_time(self) -> bool:
        """Whether a feature's table evicts by data time (``zch`` with ``eviction: ttl``):
        its batches then carry each row's time (:data:`TIME_COLUMN`)."""
        return any(f.mode == "zch" and (f.collision or {}).get("eviction") == "ttl"
                   for f in self.sparse)

    def table_sizes(self) -> dict[str, int]:
        """Feature name -> embedding rows."""
        return {f.name: f.num_embeddings for f in self.sparse}

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise DatasetError(
                f"the dataset has no split {name!r}",
                hint=f"available splits: {', '.join(sorted(self.splits)) or 'none'}",
            )
        return self.splits[name]

    # ---- (de)serialisation -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["format"] = FORMAT
        data["splits"] = {k: dataclasses.asdict(v) for k, v in self.splits.items()}
        return data

    def content_hash(self) -> str:
        """A hash of the manifest's content (what later artifacts record as their dataset)."""
        return json_sha256(self.to_dict())

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/manifest.json`` atomically."""
        path = Path(folder) / MANIFEST_NAME
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = MANIFEST_NAME) -> DatasetManifest:
        if data.get("format") != FORMAT:
            raise FormatError(
                f"not a ctrctl dataset manifest (format={data.get('format')!r})",
                where=where,
                hint="point --dataset at a folder written by `ctrctl preprocess`",
            )
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise FormatError(
                f"manifest format version {version} is not supported (this ctrctl reads "
                f"version {FORMAT_VERSION})",
                where=where,
                hint="re-run `ctrctl preprocess` with this version of ctrctl",
            )
        try:
            dense = tuple(DenseFeature(**d) for d in data["dense"])
            sparse = tuple(SparseFeature(**s) for s in data["sparse"])
            splits = {
                k: SplitInfo(rows=int(v["rows"]), label_rate=float(v["label_rate"]),
                             files=tuple(inside(str(f), FormatError, where)
                                         for f in v.get("files", ())))
                for k, v in data["splits"].items()
            }
            manifest = cls(
                label=data["label"],
                dense=dense,
                sparse=sparse,
                splits=splits,
                schema=data.get("schema", {}),
                schema_hash=data.get("schema_hash", ""),
                inputs=tuple(data.get("inputs", ())),
                transforms=data.get("transforms", {}),
                bad_rows=data.get("bad_rows", {}),
                follows=data.get("follows"),
                created=data.get("created", ""),
                format_version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"malformed manifest: {exc!r}", where=where) from exc
        names = [("feature", f.name) for f in manifest.dense]
        names += [("feature", f.name) for f in manifest.sparse]
        for kind, name in names + [("split", split) for split in manifest.splits]:
            problem = path_name_problem(name)
            if problem:
                raise FormatError(f"{kind} name {name!r:.80} {problem}", where=where,
                                  hint="re-run `ctrctl preprocess` with a schema whose names "
                                       "are plain file names")
        for feature in manifest.sparse:
            if feature.num_embeddings <= 0:
                raise FormatError(
                    f"sparse feature {feature.name!r} has num_embeddings="
                    f"{feature.num_embeddings}",
                    where=where,
                )
        return manifest

    @classmethod
    def load(cls, folder: str | Path) -> DatasetManifest:
        """Read and validate ``folder/manifest.json``."""
        path = Path(folder) / MANIFEST_NAME
        data = read_json_file(path, DatasetError(
            "no manifest.json: not a dataset folder", where=str(folder),
            hint="create one with `ctrctl preprocess`"))
        manifest = cls.from_dict(data, where=str(path))
        manifest.check_rows(folder, where=str(path))
        return manifest

    def check_rows(self, folder: str | Path, where: str = MANIFEST_NAME) -> None:
        """Each split's ``rows`` against its Parquet files' own row counts (their footers):
        the sizing rules (batch, epochs, validation cadence) read the manifest's count.
        Splits whose files are missing or unreadable are left to the readers to report.

        Raises:
            FormatError: naming the split and both counts.
        """
        import pyarrow.parquet as pq

        for name, info in self.splits.items():
            paths = [Path(folder) / f for f in info.files]
            if not paths or not all(p.is_file() for p in paths):
                continue
            try:
                actual = sum(pq.read_metadata(p).num_rows for p in paths)
            except (OSError, ValueError):  # an unreadable file: the readers name it
                continue
            if actual != info.rows:
                raise FormatError(
                    f"split {name!r} records {info.rows:,} rows but its Parquet files hold "
                    f"{actual:,}", where=where,
                    hint="the manifest was edited or its files replaced: preprocess again")
