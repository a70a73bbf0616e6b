"""Feature schemas: what the columns of a raw log are and how each becomes a model input.

A schema is a YAML file (``schemas/criteo.yaml``, ``schemas/avazu.yaml``)::

    name: criteo                # free text, recorded in the manifest
    format: tsv                 # csv | tsv | parquet | libfm (a .gz suffix means gzip)
    separator: "\\t"             # default: tab for tsv, comma for csv, space for libfm
    header: false               # true | false | auto (auto: a first line naming the columns)
    label: label                # the label column, 0/1 as is; or mapped to 0/1:
    # label: {map: {-1: 0, 1: 1}}     raw values (as written in the file) -> 0 or 1
    # label: {threshold: 4.0}         1 when the raw number is >= 4.0 (ratings), else 0
    # (with a mapping, `name:` may name the label column; default: the role: label column)
    columns:                    # every column of the file, in file order
      - {name: label, role: label}
      - name: I1
        role: dense             # label | dense | sparse | ignore
        type: int               # dense: int | float
        transform: log1p        # log1p (default: negatives -> 0, then log(x+1)) | none | clip
        fill: 0                 # value of a missing field (default 0)
        clip: [0, 100]          # bounds for transform: clip
      - name: C1
        role: sparse
        type: hex               # sparse: hex | int | string
        hash_size: 1000000      # hash mode: id = value mod hash_size (missing -> 0) ...
        # min_count: 5          # ... or vocabulary mode: values seen >= min_count times in
        #                         the training split get ids 1..V, the rest id 0 (OOV)
        multi_hot_separator: "|"   # optional: the field is a list of values
      - name: user_id
        role: sparse
        type: string
        # ... or managed collisions: the raw 64-bit key is kept (hex/int value, or a
        # stable hash of a string) and the model maps it to one of `capacity` rows
        collision: {kind: zch, capacity: 100000, eviction: lru}   # lfu | lru | ttl
        #   ttl_days: 7           # ttl: free a row unused for 7 days of data time
        #   admit_min_count: 2    # lookups before an id gets a row of its own (default 1)
        #   shards: 8             # the remapper state in 8 parts, each on the rank of its rows
      # two-tower retrieval: role: query | item | item_id is a sparse feature of that
      # tower (read back as role: sparse, tower: query ...)
      - name: hour
        role: ignore
        derive:                 # optional: sparse features computed from a timestamp
          format: "%y%m%d%H"    # strptime format of the raw value
          features: [hour_of_day, weekday]   # become sparse features hour_of_day, weekday

A ``ttl`` collision needs the data time: ``time_column: NAME`` names a column whose
value is the event time, in days (a number), or a timestamp read with that column's
``derive.format``.

An implicit-feedback log for retrieval adds (``schemas/movielens_retrieval.yaml``)::

    interactions:
      user: user                # leave-last-out groups by this column
      time: timestamp           # and orders by this one
      positives: label          # label: keep rows labelled 1 | all: every row is positive

libfm files (``label idx:value idx:value ...``, one field per position, e.g. Frappe) list
one column per field position in ``columns``: a sparse column takes each field's index, a
dense one its value (``ctrctl/data/readers.py`` splits the fields).

Sparse values of type ``string`` are hashed with polars' ``hash(seed=0)``, which is stable
within one polars version only: the manifest records the polars version and
``--reuse-transforms`` refuses a dataset written by another one. Hex and int values need no
hash (the value itself is taken modulo ``hash_size``), so they are stable everywhere.

Example:
    >>> schema = load_schema("schemas/criteo.yaml")
    >>> [c.name for c in schema.dense]       # ['I1', ..., 'I13']
    >>> schema.content_hash()                # recorded in the dataset manifest
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ctrctl.errors import SchemaError
from ctrctl.io import json_sha256, path_name_problem, read_text

Role = Literal["label", "dense", "sparse", "ignore"]
#: The two-tower side of a sparse feature: the query (user) tower, the item tower, or the
#: item's identity (an item-tower feature that also names the item to retrieve).
Tower = Literal["query", "item", "item_id"]
DerivedFeature = Literal["hour_of_day", "weekday", "day"]

#: Embedding rows of each derived feature (hour 0-23, weekday 1-7, day of month 1-31).
DERIVED_SIZES: dict[str, int] = {"hour_of_day": 24, "weekday": 8, "day": 32}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Derive(_Frozen):
    """Sparse features derived from a timestamp column (e.g. Avazu's ``hour``, YYMMDDHH)."""

    format: str
    features: tuple[DerivedFeature, ...]


class Collision(_Frozen):
    """A managed-collision ("zch") table for a sparse feature (``ctrctl/modules/collisions.py``).

    Attributes:
        kind: ``zch``.
        capacity: the table's rows, the shared default row included (at least 2).
        eviction: ``lfu``, ``lru`` or ``ttl`` (needs ``ttl_days`` and the schema's
            ``time_column``).
        ttl_days: ``ttl``: a row not looked up for this many days of data time is freed.
        admit_min_count: lookups an id needs before it gets a row of its own.
        shards: the remapper's state in this many fixed parts (by a hash of the key), each
            held by the rank holding its rows; each part admits and evicts on its own.
    """

    kind: Literal["zch"]
    capacity: int
    eviction: Literal["lfu", "lru", "ttl"] = "lfu"
    ttl_days: float | None = None
    admit_min_count: int = 1
    shards: int = 1

    @model_validator(mode="after")
    def _check(self) -> Collision:
        if self.capacity < 2:
            raise ValueError(f"collision capacity {self.capacity}: a zch table needs its "
                             "default row and at least one more (capacity >= 2)")
        if self.eviction == "ttl" and (self.ttl_days is None or self.ttl_days <= 0):
            raise ValueError("collision eviction ttl needs ttl_days > 0")
        if self.eviction != "ttl" and self.ttl_days is not None:
            raise ValueError(f"ttl_days is for eviction ttl, not {self.eviction}")
        if self.admit_min_count < 1:
            raise ValueError("collision admit_min_count must be >= 1")
        if not 1 <= self.shards <= self.capacity - 1:
            raise ValueError(f"collision shards {self.shards}: use 1 <= shards <= capacity - 1")
        return self


class LabelRule(_Frozen):
    """How raw label values become 0/1: a ``map`` of raw text to 0/1, or a ``threshold``.

    Attributes:
        map: raw value (as written in the file, e.g. ``"-1"``) -> 0 or 1; any other value
            is a malformed label.
        threshold: the label is 1 when the raw value, read as a number, is >= this.
    """

    map: dict[str, int] | None = None
    threshold: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _keys_as_text(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("map"), dict):
            data = {**data, "map": {_raw_text(k): v for k, v in data["map"].items()}}
        return data

    @model_validator(mode="after")
    def _check(self) -> LabelRule:
        if (self.map is None) == (self.threshold is None):
            raise ValueError("label: give exactly one of map or threshold")
        if self.map is not None:
            if not self.map:
                raise ValueError("label.map is empty")
            bad = {k: v for k, v in self.map.items() if v not in (0, 1)}
            if bad:
                raise ValueError(f"label.map must map to 0 or 1, not {bad}")
        return self


def _raw_text(key: Any) -> str:
    """A YAML key as the file would write it (-1 -> "-1", True -> "true")."""
    if isinstance(key, bool):
        return str(key).lower()
    return str(key)


class Column(_Frozen):
    """One column of the raw file.

    Attributes:
        name: the column's name (the Parquet column it becomes).
        role: label, dense, sparse or ignore.
        type: the raw value's type: int/float for dense, hex/int/string for sparse.
        transform: dense only: log1p, none or clip.
        fill: dense only: the value of a missing field.
        clip: dense only: (low, high) for ``transform: clip``.
        hash_size: sparse, hash mode: ids are ``value mod hash_size``.
        min_count: sparse, vocabulary mode: the frequency threshold.
        collision: sparse, managed-collision mode: raw keys, remapped in the model.
        multi_hot_separator: sparse only: the field holds a list of values.
        derive: sparse features computed from this column.
    """

    name: str
    role: Role
    type: Literal["int", "float", "hex", "string"] | None = None
    transform: Literal["log1p", "none", "clip"] = "log1p"
    fill: float = 0.0
    clip: tuple[float, float] | None = None
    hash_size: int | None = None
    min_count: int | None = None
    collision: Collision | None = None
    multi_hot_separator: str | None = None
    derive: Derive | None = None
    tower: Tower | None = None

    @model_validator(mode="before")
    @classmethod
    def _tower_role(cls, data: Any) -> Any:
        """``role: query|item|item_id`` is a sparse feature of that tower (``tower:``)."""
        if isinstance(data, dict) and data.get("role") in ("query", "item", "item_id"):
            return {**data, "role": "sparse", "tower": data["role"]}
        return data

    @model_validator(mode="after")
    def _check(self) -> Column:
        if self.tower is not None and self.role != "sparse":
            raise ValueError(f"column {self.name!r}: tower is for sparse columns")
        problem = path_name_problem(self.name)
        if problem:
            raise ValueError(f"column name {self.name!r:.80} {problem}")
        if self.role == "dense":
            if self.type not in (None, "int", "float"):
                raise ValueError(f"dense column {self.name!r}: type must be int or float")
            if self.transform == "clip" and self.clip is None:
                raise ValueError(f"dense column {self.name!r}: transform clip needs clip: [lo, hi]")
        if self.role == "sparse":
            if self.type not in (None, "hex", "int", "string"):
                raise ValueError(f"sparse column {self.name!r}: type must be hex, int or string")
            modes = [self.hash_size, self.min_count, self.collision]
            if sum(m is not None for m in modes) != 1:
                raise ValueError(
                    f"sparse column {self.name!r}: give exactly one of hash_size (hash mode), "
                    "min_count (vocabulary mode) or collision (managed collisions)"
                )
            if self.hash_size is not None and self.hash_size <= 0:
                raise ValueError(f"sparse column {self.name!r}: hash_size must be positive")
            if self.min_count is not None and self.min_count < 1:
                raise ValueError(f"sparse column {self.name!r}: min_count must be >= 1")
        elif (self.hash_size, self.min_count, self.collision) != (None, None, None):
            raise ValueError(f"column {self.name!r}: hash_size/min_count/collision are for "
                             "sparse columns")
        return self

    @property
    def value_type(self) -> str:
        """The raw type with its per-role default (dense: float, sparse: hex, label: int)."""
        if self.type is not None:
            return self.type
        return {"dense": "float", "sparse": "hex"}.get(self.role, "int")

    @property
    def mode(self) -> str:
        """``hash``, ``vocab`` or ``zch`` for a sparse column."""
        if self.collision is not None:
            return "zch"
        return "vocab" if self.min_count is not None else "hash"


class Interactions(_Frozen):
    """An implicit-feedback log for retrieval: which rows are positives, and their order.

    Attributes:
        user: the column a user's interactions are grouped by (leave-last-out split).
        time: the column ordering a user's interactions (a number, e.g. Unix seconds).
        positives: ``label``: only rows whose label is 1 are kept (e.g. rating >= 4);
            ``all``: every row is a positive.
    """

    user: str
    time: str
    positives: Literal["label", "all"] = "label"


class Schema(_Frozen):
    """A parsed, validated schema (see the module docstring for the YAML)."""

    name: str
    format: Literal["csv", "tsv", "parquet", "libfm"] = "tsv"
    separator: str | None = None
    header: bool | Literal["auto"] = False
    label: str
    label_rule: LabelRule | None = None
    time_column: str | None = None
    columns: tuple[Column, ...]
    interactions: Interactions | None = None

    @model_validator(mode="before")
    @classmethod
    def _label_mapping(cls, data: Any) -> Any:
        """``label: {map: ...}`` / ``{threshold: ...}``: the column name plus its rule."""
        if not isinstance(data, dict) or not isinstance(data.get("label"), dict):
            return data
        spec = dict(data["label"])
        name = spec.pop("name", None)
        if name is None:
            roles = [c.get("name") for c in data.get("columns", ()) or ()
                     if isinstance(c, dict) and c.get("role") == "label"]
            name = roles[0] if len(roles) == 1 else None
        if name is None:
            raise ValueError("label: {map/threshold} needs one column with role: label, "
                             "or name: COLUMN")
        return {**data, "label": name, "label_rule": spec}

    @model_validator(mode="after")
    def _check(self) -> Schema:
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate column names: {dupes}")
        labels = [c.name for c in self.columns if c.role == "label"]
        if labels != [self.label]:
            raise ValueError(
                f"label {self.label!r} must be the one column with role: label (found {labels})"
            )
        derived = [name for _, name, _ in self.derived_features()]
        for name in derived:
            problem = path_name_problem(name)
            if problem:
                raise ValueError(f"derived feature name {name!r:.80} {problem}")
        clash = sorted(set(derived) & set(names))
        if clash:
            raise ValueError(f"derived features clash with columns: {clash}")
        if not self.dense and not self.sparse_names:
            raise ValueError("the schema has no dense and no sparse feature")
        ttl = [c.name for c in self.sparse if c.collision and c.collision.eviction == "ttl"]
        if ttl and self.time_column is None:
            raise ValueError(f"collision eviction ttl ({', '.join(ttl)}) needs the data time: "
                             "name the event-time column with time_column")
        if self.time_column is not None and self.time_column not in names:
            raise ValueError(f"time_column {self.time_column!r} is not a column")
        if self.separator is not None and len(self.separator) != 1:
            raise ValueError("separator must be one character")
        if self.interactions is not None:
            self._check_interactions(self.interactions, names)
        return self

    def _check_interactions(self, spec: Interactions, names: list[str]) -> None:
        for key in ("user", "time"):
            if getattr(spec, key) not in names:
                raise ValueError(f"interactions.{key} {getattr(spec, key)!r} is not a column")
        ids = [c.name for c in self.sparse if c.tower == "item_id"]
        if len(ids) != 1:
            raise ValueError(f"interactions need one column with role: item_id (found {ids})")
        if not any(c.tower == "query" for c in self.sparse):
            raise ValueError("interactions need at least one column with role: query")

    def towers(self) -> dict[str, list[str]]:
        """Sparse features per tower: ``{"query": [...], "item": [...]}``; the item_id
        feature is the first of ``item``."""
        query = [c.name for c in self.sparse if c.tower == "query"]
        item = [c.name for c in self.sparse if c.tower == "item_id"]
        item += [c.name for c in self.sparse if c.tower == "item"]
        return {"query": query, "item": item}

    # ---- queries -------------------------------------------------------------------
    @property
    def sep(self) -> str:
        """The field separator."""
        if self.separator is not None:
            return self.separator
        return {"csv": ",", "libfm": " "}.get(self.format, "\t")

    @property
    def dense(self) -> list[Column]:
        return [c for c in self.columns if c.role == "dense"]

    @property
    def sparse(self) -> list[Column]:
        return [c for c in self.columns if c.role == "sparse"]

    def derived_features(self) -> list[tuple[Column, str, str]]:
        """(source column, feature name, kind) for each derived sparse feature."""
        return [
            (c, kind, kind) if len(self._derive_sources()) == 1 else (c, f"{c.name}_{kind}", kind)
            for c in self.columns
            if c.derive is not None
            for kind in c.derive.features
        ]

    def _derive_sources(self) -> list[str]:
        return [c.name for c in self.columns if c.derive is not None]

    @property
    def sparse_names(self) -> list[str]:
        """Output sparse features in order: sparse columns, then derived features."""
        return [c.name for c in self.sparse] + [n for _, n, _ in self.derived_features()]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def content_hash(self) -> str:
        """sha256 of the schema's canonical JSON (independent of YAML layout and comments)."""
        return json_sha256(self.to_dict())

    def with_vocab(self, min_count: int) -> Schema:
        """The same schema with every sparse column in vocabulary mode (``min_count``)."""
        columns = tuple(
            c.model_copy(update={"hash_size": None, "min_count": min_count, "collision": None})
            if c.role == "sparse"
            else c
            for c in self.columns
        )
        return self.model_copy(update={"columns": columns})

    @classmethod
    def from_dict(cls, data: Any, where: str = "schema") -> Schema:
        """Validate a parsed YAML/JSON mapping."""
        if not isinstance(data, dict):
            raise SchemaError("a schema must be a mapping", where=where)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise SchemaError(
                f"invalid schema: {first['msg']}" + (f" at {loc}" if loc else ""),
                where=where,
                hint="see the format in the docstring of ctrctl/data/schema.py",
            ) from exc


#: The folder of the shipped schemas, as pipelines name them (``schemas/criteo.yaml``).
SCHEMAS_FOLDER = "schemas"


def resolve_schema_path(path: str | Path) -> Path:
    """``path`` when it exists; otherwise a shipped schema of that name (``schemas/NAME.yaml``
    or ``NAME.yaml`` resolves against the installed package), else ``path`` unchanged.

    Example:
        >>> resolve_schema_path("schemas/criteo.yaml")   # from any folder
        PosixPath('.../site-packages/ctrctl/schemas/criteo.yaml')
    """
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts
    if (len(parts) == 2 and parts[0] == SCHEMAS_FOLDER) or len(parts) == 1:
        from importlib.resources import files

        shipped = Path(str(files("ctrctl") / SCHEMAS_FOLDER / parts[-1]))
        if shipped.is_file():
            return shipped
    return path


def load_schema(path: str | Path) -> Schema:
    """Read and validate a schema YAML file.

    Args:
        path: the YAML file; ``schemas/NAME.yaml`` not found in the working folder is the
            schema shipped with ctrctl (:func:`resolve_schema_path`).

    Example:
        >>> load_schema("schemas/avazu.yaml").label
        'click'
    """
    path = resolve_schema_path(path)
    text = read_text(path, SchemaError, "schema file",
                     hint="pass --schema schemas/criteo.yaml or another schema YAML")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SchemaError(f"invalid YAML: {exc}", where=str(path)) from exc
    return Schema.from_dict(data, where=str(path))
