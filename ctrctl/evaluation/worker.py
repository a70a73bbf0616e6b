"""One evaluation rank under torchrun: ``python -m ctrctl.evaluation.worker --spec JSON``.

Joins the process group, runs :func:`ctrctl.evaluation.evaluate.evaluate` with the spec's
settings on this rank's slice of the split, and closes the group. Gates are recorded in the
output folder (``gates.json``), not raised: the launching process reports them. A user error
becomes one line on stderr and exit code 1, naming the rank; torchrun then stops the others.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ctrctl.evaluation.worker")
    parser.add_argument("--spec", required=True, help="an EvalSpec as JSON")
    args = parser.parse_args(argv)

    from ctrctl.distributed.launch import init_process_group, run_rank, worker_logging
    from ctrctl.evaluation.evaluate import evaluate
    from ctrctl.evaluation.launch import EvalSpec
    from ctrctl.progress import LogProgress
    from ctrctl.tracking import Tracker, make_tracker

    spec = EvalSpec.from_json(args.spec)
    rank = worker_logging()

    def body() -> None:
        init_process_group()
        tracker = (make_tracker(spec.track, spec.tracking_uri, spec.experiment)
                   if rank == 0 else Tracker())
        evaluate(spec.out, checkpoint=spec.checkpoint, dataset=spec.dataset,
                 predictions=spec.predictions, split=spec.split, segment_by=spec.segment_by,
                 gates=spec.gates, save_predictions=spec.save_predictions, keep=spec.keep,
                 baselines=spec.baselines, overwrite=spec.overwrite,
                 batch_size=spec.batch_size, num_bins=spec.num_bins,
                 exact_limit=spec.exact_limit, ece_bins=spec.ece_bins, tracker=tracker,
                 progress=LogProgress() if rank == 0 else None, gates_raise=False)

    return run_rank(rank, body)


if __name__ == "__main__":
    sys.exit(main())
