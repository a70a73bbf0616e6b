"""The checkpoint format: sharded tables, dense state, optimizer and trainer state on disk.

Below both ``distributed`` (which saves and loads sharded modules through it) and ``training``
(which writes a checkpoint every N steps and resumes from one); it knows tensors and files,
not modules. The layout and its guarantees are described in :mod:`ctrctl.checkpoint.format`.

Example:
    >>> from ctrctl import checkpoint as ckpt
    >>> meta = ckpt.read_metadata("runs/a")          # the latest step of a training output
    >>> [block] = ckpt.load_table_shards(meta.path, [("C1", 0, 0, 500, 16)])
"""

from ctrctl.checkpoint.format import (
    CHECKPOINT_FORMAT,
    CheckpointMetadata,
    Piece,
    TableShard,
    export_table_weights,
    import_table_weights,
    latest_checkpoint,
    load_dense,
    load_rng_state,
    load_table_shards,
    load_trainer_state,
    prune_checkpoints,
    read_metadata,
    resolve_checkpoint,
    restore_rng_state,
    save_checkpoint,
    step_dir_name,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointMetadata",
    "Piece",
    "TableShard",
    "export_table_weights",
    "import_table_weights",
    "latest_checkpoint",
    "load_dense",
    "load_rng_state",
    "load_table_shards",
    "load_trainer_state",
    "prune_checkpoints",
    "read_metadata",
    "resolve_checkpoint",
    "restore_rng_state",
    "save_checkpoint",
    "step_dir_name",
]
