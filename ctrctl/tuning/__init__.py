"""Hyperparameter search: ``ctrctl tune`` on Optuna, every trial a training run on val.

Example:
    >>> from ctrctl.tuning import TuneRequest, tune
    >>> result = tune(TuneRequest(dataset=Path("data/avazu"), out=Path("runs/tune"), trials=12))
    >>> result.best_yaml                       # accepted by `ctrctl train --config`
"""

from ctrctl.tuning.space import Param, default_space, load_space
from ctrctl.tuning.study import METRICS, PRUNERS, TuneRequest, TuneResult, tune

__all__ = ["METRICS", "PRUNERS", "Param", "TuneRequest", "TuneResult", "default_space",
           "load_space", "tune"]
