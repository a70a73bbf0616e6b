"""Training: the loop, checkpoints and resume, prediction from a checkpoint, torchrun launch.

Example:
    >>> from ctrctl.config import load_config
    >>> from ctrctl.training import train, predict_split
    >>> result = train("dataset", "runs/a", load_config("pipelines/small.yaml"))
    >>> for labels, scores in predict_split("runs/a", "dataset", "test"):
    ...     ...
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
from ctrctl.training.predict import load_model, predict_split

__all__ = [
    "TableShard",
    "TrainResult",
    "evaluate_model",
    "export_table_weights",
    "import_table_weights",
    "load_model",
    "load_table_shards",
    "predict_split",
    "read_metadata",
    "resolve_checkpoint",
    "save_checkpoint",
    "train",
]
