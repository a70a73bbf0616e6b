"""One rank of a multi-process trial: ``python -m ctrctl.tuning.rank --spec JSON ...``.

As :mod:`ctrctl.training.worker`, plus the pruner: after each validation rank 0 reports the
metric to the trial in the study's storage and asks whether to prune; the answer is
broadcast so every rank stops at the same step (a sharded model's ranks must step together).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ctrctl.tuning.rank")
    parser.add_argument("--spec", required=True, help="a TrainSpec as JSON")
    parser.add_argument("--storage", required=True, help="the study's RDB storage URL")
    parser.add_argument("--trial-id", type=int, required=True)
    parser.add_argument("--metric", required=True)
    args = parser.parse_args(argv)
    from ctrctl.distributed.launch import die_with_launcher

    die_with_launcher()

    import torch
    import torch.distributed as dist

    from ctrctl.config import load_config
    from ctrctl.distributed.launch import init_process_group, run_rank, worker_logging
    from ctrctl.tracking import Tracker, make_tracker
    from ctrctl.training.launch import TrainSpec
    from ctrctl.training.loop import train
    from ctrctl.tuning.trial import STUDY_NAME, TrialTracker

    spec = TrainSpec.from_json(args.spec)
    rank = worker_logging()
    key = args.metric.removeprefix("val.")

    def body() -> None:
        import optuna

        config = load_config(spec.config, spec.overrides)
        init_process_group(config.training.device)
        trial = None
        tracker: Tracker = Tracker()
        if rank == 0:
            study = optuna.load_study(study_name=STUDY_NAME, storage=args.storage)
            trial = optuna.trial.Trial(study, args.trial_id)
            if spec.track:
                tracker = TrialTracker(make_tracker(True, spec.tracking_uri, spec.experiment),
                                       trial.number)

        def on_validation(step: int, values: dict[str, float]) -> bool:
            answer = 0
            if trial is not None and key in values:
                trial.report(values[key], step)
                answer = int(trial.should_prune())
            # NCCL broadcasts device tensors only
            device = torch.device("cuda", torch.cuda.current_device()) \
                if dist.get_backend() == "nccl" else torch.device("cpu")
            flag = torch.tensor([answer], dtype=torch.int64, device=device)
            dist.broadcast(flag, src=0)
            return bool(flag.item())

        train(spec.dataset, spec.out, config, overwrite=spec.overwrite, tracker=tracker,
              on_validation=on_validation)

    return run_rank(rank, body)


if __name__ == "__main__":
    sys.exit(main())
