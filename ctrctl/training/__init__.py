"""Training: the loop, checkpoints and resume, torchrun launch.

Scoring a checkpoint lives in :mod:`ctrctl.inference.predictor`.

Example:
    >>> from ctrctl.config import load_config
    >>> from ctrctl.training import train
    >>> result = train("dataset", "runs/a", load_config("pipelines/small.yaml"))
"""

from ctrctl.training.checkpoint import (
    TableShard,
    export_table_weights,
    import_table_weights,
    load_table_shards,
    read_metadata,
    resolve_checkpoint,
    save_checkpoint,
)
from ctrctl.training.loop import TrainResult, evaluate_model, train

__all__ = [
    "TableShard",
    "TrainResult",
    "evaluate_model",
    "export_table_weights",
    "import_table_weights",
    "load_table_shards",
    "read_metadata",
    "resolve_checkpoint",
    "save_checkpoint",
    "train",
]
