"""The runner: ``ctrctl run PIPELINE.yaml`` executes a pipeline YAML's steps in process.

("runner", not "pipeline": a *pipeline YAML* configures a run and a *train pipeline*
overlaps training steps.) Steps: synth (optional) -> preprocess -> plan -> train -> eval ->
quantize -> register, each one's output the next one's input under one working folder,
each skipped when what it reads and its settings are unchanged since it last completed.

Example:
    >>> result = run_pipeline("pipelines/demo.yaml", workdir="runs/demo")
    >>> [o.status for o in result.outcomes]
"""

from ctrctl.io import tree_sha256
from ctrctl.runner.core import GATE_FAILED_EXIT, KEY_METRICS, RunResult, StepOutcome, run_pipeline
from ctrctl.runner.events import CallbackObserver, RunObserver
from ctrctl.runner.steps import STEPS

__all__ = ["GATE_FAILED_EXIT", "KEY_METRICS", "STEPS", "CallbackObserver", "RunObserver",
           "RunResult", "StepOutcome", "run_pipeline", "tree_sha256"]
