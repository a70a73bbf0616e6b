"""The exact metrics, as evaluation's modules import them: defined in :mod:`ctrctl.metrics`
(below training, which validates with them)."""

from ctrctl import metrics as _metrics
from ctrctl.metrics import *  # noqa: F403

__all__ = list(_metrics.__all__)
