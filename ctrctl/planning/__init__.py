"""The plan step: what ``ctrctl plan`` runs around the pure planner.

:mod:`ctrctl.distributed.planner` turns tables and a topology into a plan and touches nothing
else. This package does the rest of the step: it reads the tables from a dataset manifest,
a tables YAML or a pipeline config, writes ``plan.json``, tracks the run (``request.py``), and
measures this machine's kernels and collectives on real processes to calibrate the cost
model (``calibration.py``, ``measure.py``).

Example:
    >>> from ctrctl.planning import PlanRequest, run_plan
    >>> outcome = run_plan(PlanRequest(dataset=Path("dataset"), world_size=2,
    ...                                out=Path("plan.json")))
"""

from __future__ import annotations

from ctrctl.planning.calibration import calibrate
from ctrctl.planning.request import PlanOutcome, PlanRequest, run_plan

__all__ = ["PlanOutcome", "PlanRequest", "calibrate", "run_plan"]
