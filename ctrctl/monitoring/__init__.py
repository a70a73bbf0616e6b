"""Monitoring of a model on new or served rows: drift against its training split, calibration
on rows whose labels arrived, gates as alarms (``ctrctl monitor``).

Example:
    >>> from ctrctl.monitoring import monitor
    >>> result = monitor("export", "out", dataset="data/day2", split="test")
    >>> result.metrics["psi"]["max"], result.metrics["calibration"]
"""

from ctrctl.monitoring.drift import psi
from ctrctl.monitoring.join import join_labels
from ctrctl.monitoring.monitor import MonitorResult, monitor

__all__ = ["MonitorResult", "join_labels", "monitor", "psi"]
