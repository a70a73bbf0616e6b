"""One training rank under torchrun: ``python -m ctrctl.training.worker --spec JSON``.

Opens the process group, runs :func:`ctrctl.training.loop.train` with the spec's settings,
and closes the group. A user error becomes one line on stderr and exit code 1, naming the
rank; torchrun then stops the other ranks.
"""

from __future__ import annotations

import argparse
import logging
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ctrctl.training.worker")
    parser.add_argument("--spec", required=True, help="a TrainSpec as JSON")
    args = parser.parse_args(argv)
    from ctrctl.distributed.launch import die_with_launcher

    die_with_launcher()  # first: the imports below take seconds

    from ctrctl.config import load_config
    from ctrctl.distributed.launch import init_process_group, run_rank, worker_logging
    from ctrctl.distributed.types import ShardingPlan
    from ctrctl.progress import LogProgress
    from ctrctl.tracking import Tracker, make_tracker
    from ctrctl.training.launch import TrainSpec
    from ctrctl.training.loop import train

    spec = TrainSpec.from_json(args.spec)
    rank = worker_logging()

    def body() -> None:
        config = load_config(spec.config, spec.overrides)
        init_process_group(config.training.device)
        plan = ShardingPlan.load(spec.plan) if spec.plan else None
        tracker = (make_tracker(spec.track, spec.tracking_uri, spec.experiment)
                   if rank == 0 else Tracker())
        result = train(spec.dataset, spec.out, config, resume=spec.resume,
                       overwrite=spec.overwrite, plan=plan, tracker=tracker,
                       progress=LogProgress() if rank == 0 else None)
        if rank == 0:
            logging.getLogger("ctrctl").info("finished at step %d: %s", result.step,
                                             result.metrics)

    return run_rank(rank, body)


if __name__ == "__main__":
    sys.exit(main())
