"""Training: the loop and resume, prediction from a checkpoint, torchrun launch.

The checkpoint format itself is :mod:`ctrctl.checkpoint`.

Example:
    >>> from ctrctl.config import load_config
    >>> from ctrctl.training import train, predict_split
    >>> result = train("dataset", "runs/a", load_config("pipelines/small.yaml"))
    >>> for labels, scores in predict_split("runs/a", "dataset", "test"):
    ...     ...
"""

from ctrctl.training.loop import TrainResult, evaluate_model, train
from ctrctl.training.predict import load_model, predict_split

__all__ = [
    "TrainResult",
    "evaluate_model",
    "load_model",
    "predict_split",
    "train",
]
