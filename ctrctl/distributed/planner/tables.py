"""Where the planner's tables come from: a dataset manifest, a tables YAML, a pipeline config.

A tables YAML is either the short form (one dim for every table)::

    embedding_dim: 128
    num_embeddings_per_feature: [40000000, 39060, 17295]   # or {C1: 40000000, ...}
    pooling_factor: 1.0            # optional, for every table

or a list of tables, each with its own shape and constraints::

    tables:
      - {name: user, num_embeddings: 10000000, embedding_dim: 256, pooling_factor: 1}
      - {name: history, num_embeddings: 5000000, embedding_dim: 64, pooling_factor: 30,
         sharding_types: [row_wise, table_row_wise], min_col_block: 32}
    constraints:                   # optional, by table name (both forms)
      user: {compute_kernels: [fused_uvm_caching], cache_load_factor: 0.1, ranks: [0, 1]}

Example:
    >>> tables = tables_from_yaml("tables.yaml")
    >>> tables = tables_from_manifest(DatasetManifest.load("dataset"), embedding_dim=64)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed.planner.types import TableConstraints, TableSpec
from ctrctl.errors import ConfigError, PlanError
from ctrctl.io import read_text

_CONSTRAINT_KEYS = {"sharding_types", "compute_kernels", "min_col_block", "ranks",
                    "cache_load_factor"}
_TABLE_KEYS = {"name", "num_embeddings", "embedding_dim", "pooling_factor", "data_type",
               "optimizer"} | _CONSTRAINT_KEYS


def constraints_from_dict(data: dict[str, Any], where: str) -> TableConstraints:
    """A :class:`TableConstraints` from YAML values (lists become tuples)."""
    unknown = sorted(set(data) - _CONSTRAINT_KEYS)
    if unknown:
        raise ConfigError(f"unknown constraint keys: {', '.join(unknown)}", where=where,
                          hint=f"known: {', '.join(sorted(_CONSTRAINT_KEYS))}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                              for k, v in data.items()}
    try:
        return TableConstraints(**values)
    except PlanError as exc:
        raise ConfigError(exc.message, where=where, hint=exc.hint) from exc


def tables_from_manifest(manifest: DatasetManifest, embedding_dim: int,
                         optimizer: str = "rowwise_adagrad", data_type: str = "fp32",
                         constraints: dict[str, TableConstraints] | None = None
                         ) -> list[TableSpec]:
    """One table per sparse feature: its ``num_embeddings`` rows, ``mean_length`` pooling.

    Args:
        manifest: the dataset's manifest.
        embedding_dim: the model's embedding dim (every table).
        optimizer: the embedding optimizer (its state counts in memory).
        data_type: weight data type.
        constraints: per-table constraints by feature name.
    """
    constraints = constraints or {}
    unknown = sorted(set(constraints) - set(manifest.sparse_names))
    if unknown:
        raise ConfigError(f"constraints name features the dataset lacks: {', '.join(unknown)}",
                          hint=f"features: {', '.join(manifest.sparse_names)}")
    return [TableSpec(f.name, f.num_embeddings, embedding_dim,
                      pooling_factor=float(f.mean_length or 1.0), optimizer=optimizer,
                      data_type=data_type,
                      constraints=constraints.get(f.name, TableConstraints()))
            for f in manifest.sparse]


#: Keys a tables YAML may have at its top.
_TOP_KEYS = {"tables", "constraints", "embedding_dim", "num_embeddings_per_feature",
             "pooling_factor", "data_type", "optimizer"}


def tables_from_dict(data: dict[str, Any], where: str = "tables",
                     optimizer: str = "rowwise_adagrad") -> list[TableSpec]:
    """Tables from the parsed YAML (see the module docstring for the two forms)."""
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping with `tables:` or `num_embeddings_per_feature:`",
                          where=where)
    by_name = {name: constraints_from_dict(c or {}, f"{where}: constraints.{name}")
               for name, c in (data.get("constraints") or {}).items()}
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"unknown keys: {', '.join(map(str, unknown))}", where=where,
                          hint=f"known: {', '.join(sorted(_TOP_KEYS))}")
    tables: list[TableSpec] = []
    try:
        if "tables" in data:
            for i, entry in enumerate(data["tables"]):
                at = f"{where}: tables[{i}]"
                unknown = sorted(set(entry) - _TABLE_KEYS)
                if unknown:
                    raise ConfigError(f"unknown keys: {', '.join(unknown)}", where=at,
                                      hint=f"known: {', '.join(sorted(_TABLE_KEYS))}")
                name = str(entry.get("name", f"t{i}"))
                own = {k: v for k, v in entry.items() if k in _CONSTRAINT_KEYS}
                cons = by_name.get(name) or constraints_from_dict(own, at)
                tables.append(TableSpec(
                    name, int(entry["num_embeddings"]),
                    int(entry.get("embedding_dim", data.get("embedding_dim", 0))),
                    pooling_factor=float(entry.get("pooling_factor", 1.0)),
                    data_type=str(entry.get("data_type", "fp32")),
                    optimizer=str(entry.get("optimizer", optimizer)), constraints=cons))
        elif "num_embeddings_per_feature" in data:
            sizes = data["num_embeddings_per_feature"]
            named = sizes.items() if isinstance(sizes, dict) else (
                (f"t{i}", n) for i, n in enumerate(sizes))
            dim = int(data["embedding_dim"])
            pooling = data.get("pooling_factor", 1.0)
            for i, (name, rows) in enumerate(named):
                pf = pooling[i] if isinstance(pooling, list) else pooling
                tables.append(TableSpec(str(name), int(rows), dim, pooling_factor=float(pf),
                                        data_type=str(data.get("data_type", "fp32")),
                                        optimizer=str(data.get("optimizer", optimizer)),
                                        constraints=by_name.get(str(name),
                                                                TableConstraints())))
        else:
            raise ConfigError("expected `tables:` or `embedding_dim` + "
                              "`num_embeddings_per_feature:`", where=where)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"malformed tables: {exc!r}", where=where) from exc
    except PlanError as exc:
        raise ConfigError(exc.message, where=f"{where}: {exc.where}", hint=exc.hint) from exc
    missing = sorted(set(by_name) - {t.name for t in tables})
    if missing:
        raise ConfigError(f"constraints name unknown tables: {', '.join(missing)}", where=where)
    return tables


def tables_from_yaml(path: str | Path, optimizer: str = "rowwise_adagrad") -> list[TableSpec]:
    """Tables from a tables YAML file."""
    path = Path(path)
    text = read_text(path, ConfigError, "tables file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", where=str(path)) from exc
    return tables_from_dict(data, where=str(path), optimizer=optimizer)
