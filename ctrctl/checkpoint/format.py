"""Checkpoints: sharded embedding tables, dense state, optimizer states, trainer state.

One format for every world size: a one-process checkpoint is the world-size-1 case of the
sharded one, and loading under another world size or plan (resharding) is the general path,
since any block of a table is assembled from whichever saved pieces overlap it::

    OUT/checkpoints/
      latest                                 "step-00000100" (replaced atomically)
      step-00000100/                         staged beside it (ctrctl.io), then renamed
        metadata.json                        format, step, epoch, world size, plan, manifest
                                             hash, config, per table: rows, dim, optimizer and
                                             its pieces (file, offsets, sizes, state kinds)
        tables/<table>/<rank>-<i>.safetensors  "weight" (rows, cols) + "state.<name>" tensors
        dense.safetensors                    the model's dense parameters and buffers
        dense_optimizer.pt                   the dense optimizer's state_dict (weights_only)
        trainer_state.json                   step, epoch, loader position, metrics so far
        rng/<rank>.safetensors               each rank's torch RNG states

Optimizer state tensors are of two kinds: ``row`` (one value per row, e.g. rowwise Adagrad's
accumulator) and ``element`` (the weight's shape, e.g. Adagrad's). Nothing is unpickled when
loading: tensors come from safetensors, metadata from JSON, and the dense optimizer's plain
tensor dict through ``torch.load(weights_only=True)``.

Example:
    >>> shard = TableShard("C1", 0, 0, weight, {"momentum": acc})
    >>> path = save_checkpoint(out / "checkpoints", 100, [shard], model_dense_state,
    ...                        optimizer.state_dict(), {"epoch": 0, "batch": 100}, metadata)
    >>> [block] = load_table_shards(path, [("C1", 0, 0, 500, 16)])   # rows 0..499
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ctrctl.checkpoint.integrity import file_record, unreadable, verify_file
from ctrctl.errors import CheckpointError, FormatError
from ctrctl.io import (
    inside,
    publish_staged,
    read_json_file,
    stage_folder,
    write_json_atomic,
    write_text_atomic,
)

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "ctrctl.checkpoint"
CHECKPOINT_VERSION = 1
LATEST = "latest"


# ---- what is saved ---------------------------------------------------------------------------
@dataclass
class TableShard:
    """A block of one table held by one rank, with its optimizer state.

    Attributes:
        table: the table's name.
        row_offset, col_offset: where the block starts in the full table.
        weight: (rows, cols).
        optimizer_state: name -> a ``row`` tensor (rows,) or an ``element`` tensor
            (rows, cols).
    """

    table: str
    row_offset: int
    col_offset: int
    weight: torch.Tensor
    optimizer_state: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.weight.shape[0])

    @property
    def cols(self) -> int:
        return int(self.weight.shape[1])

    def state_kinds(self) -> dict[str, str]:
        """Each state tensor's kind: ``row`` or ``element``."""
        kinds = {}
        for name, value in self.optimizer_state.items():
            if tuple(value.shape) == (self.rows,):
                kinds[name] = "row"
            elif tuple(value.shape) == (self.rows, self.cols):
                kinds[name] = "element"
            else:
                raise CheckpointError(
                    f"optimizer state {name!r} of table {self.table!r} has shape "
                    f"{tuple(value.shape)}, neither ({self.rows},) nor ({self.rows}, "
                    f"{self.cols})",
                    hint="row states hold one value per row, element states the weight's shape",
                )
        return kinds


@dataclass(frozen=True)
class Piece:
    """One saved block of a table (an entry of metadata.json)."""

    file: str
    rank: int
    row_offset: int
    col_offset: int
    rows: int
    cols: int
    states: dict[str, str]

    def overlap(self, r0: int, c0: int, rows: int, cols: int) -> tuple[int, int, int, int] | None:
        """The overlap with block (r0, c0, rows, cols) as (row0, row1, col0, col1), or None."""
        lo_r, hi_r = max(r0, self.row_offset), min(r0 + rows, self.row_offset + self.rows)
        lo_c, hi_c = max(c0, self.col_offset), min(c0 + cols, self.col_offset + self.cols)
        if lo_r >= hi_r or lo_c >= hi_c:
            return None
        return lo_r, hi_r, lo_c, hi_c


@dataclass(frozen=True)
class CheckpointMetadata:
    """The parsed ``metadata.json`` of a checkpoint.

    Attributes:
        path: the step folder.
        step, epoch, world_size: when and by how many ranks it was written.
        plan: the sharding plan as a dict (None for an unsharded run).
        manifest_hash: the dataset manifest's content hash.
        config: the resolved pipeline config.
        tables: name -> {"rows", "dim", "optimizer", "pieces": [Piece, ...]}.
        extra: anything else the trainer recorded (the manifest itself, metrics).
        files: every other file of the folder -> {"bytes", "sha256"} (empty in checkpoints
            written before checksums were recorded).
    """

    path: Path
    step: int
    epoch: int
    world_size: int
    plan: dict[str, Any] | None
    manifest_hash: str
    config: dict[str, Any]
    tables: dict[str, dict[str, Any]]
    extra: dict[str, Any]
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def file(self, rel: str) -> Path:
        """The path of one of the checkpoint's files, verified against its checksum."""
        return verify_file(self.path, rel, self.files)

    def pieces(self, table: str) -> list[Piece]:
        if table not in self.tables:
            raise CheckpointError(f"the checkpoint has no table {table!r}",
                                  where=str(self.path),
                                  hint=f"tables: {', '.join(sorted(self.tables))}")
        return list(self.tables[table]["pieces"])

    def table_shape(self, table: str) -> tuple[int, int]:
        self.pieces(table)  # names the missing table
        entry = self.tables[table]
        return int(entry["rows"]), int(entry["dim"])


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


# ---- saving ------------------------------------------------------------------------------
def _barrier(process_group: Any, world_size: int) -> None:
    if world_size > 1:
        import torch.distributed as dist

        dist.barrier(group=process_group)


def _broadcast_name(name: str | None, process_group: Any, world_size: int) -> str:
    if world_size == 1:
        assert name is not None
        return name
    import torch.distributed as dist

    box = [name]
    src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
    dist.broadcast_object_list(box, src=src, group=process_group)
    assert box[0] is not None
    return str(box[0])


def _gather_pieces(pieces: list[dict[str, Any]], process_group: Any,
                   world_size: int) -> list[dict[str, Any]]:
    """Every rank's entries (pieces, file records), in rank order."""
    if world_size == 1:
        return pieces
    import torch.distributed as dist

    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, pieces, group=process_group)
    return [p for rank_pieces in gathered for p in rank_pieces]


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            state[f"cuda.{i}"] = s
    return state


def save_checkpoint(
    checkpoints: str | Path,
    step: int,
    table_shards: Sequence[TableShard],
    dense_state: Mapping[str, torch.Tensor],
    dense_optim_state: Mapping[str, Any],
    trainer_state: Mapping[str, Any],
    metadata: Mapping[str, Any],
    *,
    rank: int = 0,
    world_size: int = 1,
    process_group: Any = None,
) -> Path:
    """Write a checkpoint of ``step`` under ``checkpoints`` atomically; every rank calls it.

    Each rank writes its own table shards and RNG state; rank 0 writes the dense state (the
    same on every rank), the trainer state and ``metadata.json``, then renames the temporary
    folder after a barrier and points ``latest`` at it.

    Args:
        checkpoints: the folder holding step folders (``OUT/checkpoints``).
        step: the optimizer steps taken.
        table_shards: this rank's blocks of the tables (with DP tables only one rank should
            pass the replica).
        dense_state: dense parameters and buffers (``state_dict`` without the tables).
        dense_optim_state: the dense optimizer's ``state_dict()``.
        trainer_state: JSON data: epoch, loader position, metrics.
        metadata: JSON data: ``epoch``, ``plan``, ``manifest_hash``, ``config`` and
            ``tables`` (name -> rows, dim, optimizer); anything else is kept under extra.
        rank, world_size, process_group: this rank's place (a shared file system when > 1).

    Returns:
        The step folder.
    """
    checkpoints = Path(checkpoints)
    final = checkpoints / step_dir_name(step)
    tmp_name = None
    if rank == 0:
        # A step written again (a resumed run passing the same step) replaces the old folder.
        tmp_name = stage_folder(final, overwrite=True).name
    tmp = checkpoints / _broadcast_name(tmp_name, process_group, world_size)
    try:
        pieces: list[dict[str, Any]] = []
        counters: dict[str, int] = {}
        for shard in table_shards:
            i = counters.get(shard.table, 0)
            counters[shard.table] = i + 1
            rel = f"tables/{shard.table}/{rank}-{i}.safetensors"
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            tensors = {"weight": shard.weight.detach().contiguous().cpu()}
            tensors.update({f"state.{k}": v.detach().contiguous().cpu()
                            for k, v in shard.optimizer_state.items()})
            save_file(tensors, str(tmp / rel))
            pieces.append({"file": rel, "rank": rank, "table": shard.table,
                           "row_offset": shard.row_offset, "col_offset": shard.col_offset,
                           "rows": shard.rows, "cols": shard.cols, "states": shard.state_kinds()})
        (tmp / "rng").mkdir(exist_ok=True)
        save_file(_rng_state(), str(tmp / "rng" / f"{rank}.safetensors"))
        written = [p["file"] for p in pieces] + [f"rng/{rank}.safetensors"]
        entries = pieces + [{"record": rel, **file_record(tmp, rel)} for rel in written]
        gathered = _gather_pieces(entries, process_group, world_size)
        all_pieces = [p for p in gathered if "record" not in p]
        files = {p["record"]: {"bytes": p["bytes"], "sha256": p["sha256"]}
                 for p in gathered if "record" in p}

        if rank == 0:
            save_file({k: v.detach().contiguous().cpu() for k, v in dense_state.items()},
                      str(tmp / "dense.safetensors"))
            torch.save(dict(dense_optim_state), tmp / "dense_optimizer.pt")
            write_json_atomic(tmp / "trainer_state.json", dict(trainer_state))
            for rel in ("dense.safetensors", "dense_optimizer.pt", "trainer_state.json"):
                files[rel] = file_record(tmp, rel)
            tables: dict[str, dict[str, Any]] = {
                name: {**dict(info), "pieces": []}
                for name, info in dict(metadata.get("tables", {})).items()
            }
            for p in all_pieces:
                entry = tables.setdefault(p["table"], {"pieces": []})
                entry["pieces"].append({k: v for k, v in p.items() if k != "table"})
            for entry in tables.values():
                if "rows" not in entry or "dim" not in entry:
                    entry["rows"] = max(p["row_offset"] + p["rows"] for p in entry["pieces"])
                    entry["dim"] = max(p["col_offset"] + p["cols"] for p in entry["pieces"])
                entry.setdefault("optimizer", None)
            known = {"epoch", "plan", "manifest_hash", "config", "tables"}
            write_json_atomic(tmp / "metadata.json", {
                "format": CHECKPOINT_FORMAT,
                "format_version": CHECKPOINT_VERSION,
                "step": step,
                "epoch": int(metadata.get("epoch", trainer_state.get("epoch", 0))),
                "world_size": world_size,
                "plan": metadata.get("plan"),
                "manifest_hash": metadata.get("manifest_hash", ""),
                "config": metadata.get("config", {}),
                "tables": tables,
                "extra": {k: v for k, v in metadata.items() if k not in known},
                "files": dict(sorted(files.items())),
            })
        _barrier(process_group, world_size)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if rank == 0:
        publish_staged(tmp, final)
        write_text_atomic(checkpoints / LATEST, final.name + "\n")
        logger.info("checkpoint written: %s", final)
    _barrier(process_group, world_size)
    return final


# ---- finding and reading --------------------------------------------------------------------
def latest_checkpoint(checkpoints: str | Path) -> Path | None:
    """The step folder ``latest`` points at, or None when there is no checkpoint yet."""
    checkpoints = Path(checkpoints)
    pointer = checkpoints / LATEST
    if not pointer.is_file():
        return None
    path = checkpoints / inside(pointer.read_text().strip(), CheckpointError, str(pointer))
    if not (path / "metadata.json").is_file():
        raise CheckpointError("`latest` points at a missing checkpoint", where=str(path),
                              hint="delete the `latest` file or the incomplete folder")
    return path


def prune_checkpoints(folder: Path, keep: int) -> None:
    """Remove all but the newest ``keep`` step folders (0: keep all); never ``latest``."""
    if keep <= 0 or not folder.is_dir():
        return
    latest = latest_checkpoint(folder)
    steps = sorted(p for p in folder.glob("step-*") if p.is_dir())
    for old in steps[:-keep]:
        if latest is None or old.name != latest.name:
            shutil.rmtree(old, ignore_errors=True)


def resolve_checkpoint(path: str | Path) -> Path:
    """A step folder from a step folder, a ``checkpoints`` folder or a training output folder.

    Raises:
        CheckpointError: when none is found there.
    """
    path = Path(path)
    if (path / "metadata.json").is_file():
        return path
    for folder in (path, path / "checkpoints"):
        found = latest_checkpoint(folder) if folder.is_dir() else None
        if found is not None:
            return found
    raise CheckpointError("no checkpoint found", where=str(path),
                          hint="pass a training output folder or one of its step folders")


def read_metadata(path: str | Path) -> CheckpointMetadata:
    """Read and validate a checkpoint's ``metadata.json`` (any of resolve_checkpoint's forms)."""
    folder = resolve_checkpoint(path)
    where = str(folder / "metadata.json")
    data = read_json_file(folder / "metadata.json")
    if data.get("format") != CHECKPOINT_FORMAT:
        raise FormatError(f"not a ctrctl checkpoint (format={data.get('format')!r})",
                          where=where)
    if data.get("format_version") != CHECKPOINT_VERSION:
        raise FormatError(
            f"checkpoint format version {data.get('format_version')} is not supported (this "
            f"ctrctl reads version {CHECKPOINT_VERSION})", where=where)
    try:
        tables = {
            name: {**entry, "pieces": [Piece(**{k: v for k, v in p.items()
                                                if k != "file"},
                                             file=inside(str(p["file"]), FormatError, where))
                                       for p in entry["pieces"]]}
            for name, entry in data["tables"].items()
        }
        return CheckpointMetadata(
            path=folder, step=int(data["step"]), epoch=int(data["epoch"]),
            world_size=int(data["world_size"]), plan=data.get("plan"),
            manifest_hash=str(data.get("manifest_hash", "")), config=data.get("config", {}),
            tables=tables, extra=data.get("extra", {}),
            files={inside(str(rel), FormatError, where): dict(entry)
                   for rel, entry in dict(data.get("files", {})).items()},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"malformed checkpoint metadata: {exc!r}", where=where) from exc


def load_table_shards(
    path: str | Path,
    wanted: Sequence[tuple[str, int, int, int, int]],
    *,
    with_optimizer: bool = True,
) -> list[TableShard]:
    """Assemble blocks of tables from whichever saved pieces overlap them.

    Args:
        path: the checkpoint (see :func:`resolve_checkpoint`).
        wanted: (table, row_offset, col_offset, rows, cols) per block wanted: the blocks of
            the new plan on this rank, whatever plan wrote the checkpoint.
        with_optimizer: also assemble optimizer states.

    Returns:
        One :class:`TableShard` per wanted block. ``element`` states are cut like the weight;
        a ``row`` state of a row covered by several saved column blocks is their mean,
        weighted by the columns taken from each (exact when the column split is unchanged).

    Raises:
        CheckpointError: an unknown table, a block outside the table, or saved pieces that do
            not cover a wanted block.
    """
    meta = read_metadata(path)
    out = []
    for table, r0, c0, rows, cols in wanted:
        t_rows, t_dim = meta.table_shape(table)
        where = f"{meta.path}: table {table!r}"
        if r0 < 0 or c0 < 0 or r0 + rows > t_rows or c0 + cols > t_dim:
            raise CheckpointError(
                f"block rows {r0}..{r0 + rows} x cols {c0}..{c0 + cols} lies outside the "
                f"saved table ({t_rows} x {t_dim})", where=where,
                hint="the model's table sizes differ from the checkpoint's")
        weight: torch.Tensor | None = None
        states: dict[str, torch.Tensor] = {}
        row_weight: dict[str, torch.Tensor] = {}
        covered = 0
        seen_blocks: set[tuple[int, int, int, int]] = set()
        for piece in meta.pieces(table):
            block = (piece.row_offset, piece.col_offset, piece.rows, piece.cols)
            if block in seen_blocks:  # a replica (data parallel): one copy is enough
                continue
            box = piece.overlap(r0, c0, rows, cols)
            if box is None:
                continue
            seen_blocks.add(block)
            lo_r, hi_r, lo_c, hi_c = box
            covered += (hi_r - lo_r) * (hi_c - lo_c)
            src_r = slice(lo_r - piece.row_offset, hi_r - piece.row_offset)
            src_c = slice(lo_c - piece.col_offset, hi_c - piece.col_offset)
            dst_r, dst_c = slice(lo_r - r0, hi_r - r0), slice(lo_c - c0, hi_c - c0)
            file = meta.file(piece.file)
            try:
                handle = safe_open(str(file), framework="pt")
            except Exception as exc:  # safetensors raises its own error types
                raise unreadable(file, exc) from None
            with handle as f:
                _check_piece_shape(f, piece, file)
                part = f.get_slice("weight")[src_r, src_c]
                if weight is None:
                    weight = torch.zeros((rows, cols), dtype=part.dtype)
                weight[dst_r, dst_c] = part
                if not with_optimizer:
                    continue
                for name, kind in piece.states.items():
                    if kind == "element":
                        value = f.get_slice(f"state.{name}")[src_r, src_c]
                        if name not in states:
                            states[name] = torch.zeros((rows, cols), dtype=value.dtype)
                        states[name][dst_r, dst_c] = value
                    else:
                        value = f.get_slice(f"state.{name}")[src_r]
                        if name not in states:
                            states[name] = torch.zeros(rows, dtype=value.dtype)
                            row_weight[name] = torch.zeros(rows, dtype=torch.float64)
                        share = float(hi_c - lo_c)
                        states[name][dst_r] += (value * share).to(states[name].dtype)
                        row_weight[name][dst_r] += share
        if weight is None or covered != rows * cols:
            raise CheckpointError(
                f"the saved pieces cover {covered} of the {rows * cols} cells of block rows "
                f"{r0}..{r0 + rows} x cols {c0}..{c0 + cols}", where=where,
                hint="the checkpoint is incomplete: a rank's files are missing")
        for name, total in row_weight.items():
            states[name] = (states[name].double() / total.clamp(min=1.0)).to(states[name].dtype)
        out.append(TableShard(table, r0, c0, weight, states))
    return out


def _check_piece_shape(f: Any, piece: Piece, file: Path) -> None:
    shape = tuple(f.get_slice("weight").get_shape())
    if shape != (piece.rows, piece.cols):
        raise CheckpointError(
            f"the weight is {shape[0]} x {shape[1]}, metadata.json says {piece.rows} x "
            f"{piece.cols}", where=str(file), hint="the checkpoint's files do not match it")


def load_dense(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The dense state dict and the dense optimizer's state dict, loaded without pickle code."""
    meta = read_metadata(path)
    dense_file, optim_file = meta.file("dense.safetensors"), meta.file("dense_optimizer.pt")
    try:
        dense = load_file(str(dense_file))
    except Exception as exc:  # safetensors raises its own error types
        raise unreadable(dense_file, exc) from None
    try:
        optim = torch.load(optim_file, weights_only=True, map_location="cpu")
    except Exception as exc:  # an unpickling error: not a plain tensor dict
        raise unreadable(optim_file, exc) from None
    return dense, optim


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    meta = read_metadata(path)
    folder = meta.path
    if (folder / "trainer_state.json").is_file():
        meta.file("trainer_state.json")
    return dict(read_json_file(folder / "trainer_state.json", CheckpointError(
        "the checkpoint has no trainer_state.json", where=str(folder),
        hint="pass a checkpoint written by `ctrctl train`")))


def load_rng_state(path: str | Path, rank: int = 0) -> dict[str, torch.Tensor] | None:
    """A rank's saved RNG states (None when that rank did not exist in the saving run)."""
    meta = read_metadata(path)
    rel = f"rng/{rank}.safetensors"
    if not (meta.path / rel).is_file() and rel not in meta.files:
        return None
    file = meta.file(rel)
    try:
        return load_file(str(file))
    except Exception as exc:  # safetensors raises its own error types
        raise unreadable(file, exc) from None


def restore_rng_state(state: Mapping[str, torch.Tensor] | None) -> None:
    """Put saved RNG states back (those of devices that exist)."""
    if not state:
        return
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        for key, value in state.items():
            if key.startswith("cuda.") and int(key.split(".")[1]) < torch.cuda.device_count():
                torch.cuda.set_rng_state(value, int(key.split(".")[1]))


# ---- full tables in and out -----------------------------------------------------------------
def export_table_weights(path: str | Path, out: str | Path) -> Path:
    """Write every table's full, unsharded (rows, dim) weight into one safetensors file.

    Example:
        >>> export_table_weights("runs/x", "tables.safetensors")
    """
    meta = read_metadata(path)
    wanted = [(name, 0, 0, *meta.table_shape(name)) for name in sorted(meta.tables)]
    shards = load_table_shards(meta.path, wanted, with_optimizer=False)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file({s.table: s.weight.contiguous() for s in shards}, str(out))
    return out


def import_table_weights(file: str | Path) -> dict[str, torch.Tensor]:
    """Full table weights written by :func:`export_table_weights` (table -> (rows, dim))."""
    file = Path(file)
    if not file.is_file():
        raise CheckpointError("table weights file not found", where=str(file))
    return load_file(str(file))
