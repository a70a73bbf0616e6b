"""Training: the loop, early stopping and resume, torchrun launch.

The checkpoint format itself is :mod:`ctrctl.checkpoint`; scoring a checkpoint lives in
:mod:`ctrctl.models.scoring`; the model itself is built in :mod:`ctrctl.models.build`.

Example:
    >>> from ctrctl.config import load_config
    >>> from ctrctl.training import train
    >>> result = train("dataset", "runs/a", load_config("pipelines/small.yaml"))
"""

from ctrctl.training.loop import TrainResult, evaluate_model, train

__all__ = [
    "TrainResult",
    "evaluate_model",
    "train",
]
