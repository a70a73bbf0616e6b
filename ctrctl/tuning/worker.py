"""One of ``--parallel K`` search processes: ``python -m ctrctl.tuning.worker SPEC.json``.

Each loads the shared study from ``DIR/study.db`` and runs trials until the study holds the
requested number of finished ones (Optuna's RDB storage hands each process its own trials;
K processes may finish up to K - 1 trials beyond the count). Its sampler is seeded with the
study's seed plus its index, so the processes draw different first trials.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import optuna
    import torch

    from ctrctl.errors import CtrctlError
    from ctrctl.tuning.study import (
        TuneRequest,
        _base,
        make_objective,
        open_study,
        search_space,
    )
    from ctrctl.tuning.trial import TrialTarget, read_manifest, target_tracker

    spec = json.loads(Path(args[0]).read_text())
    raw = spec["request"]
    for key in ("dataset", "out", "config", "space"):
        if isinstance(raw.get(key), str) or raw.get(key) is None:
            raw[key] = Path(raw[key]) if raw.get(key) else None
    raw["overrides"] = tuple(raw.get("overrides", ()))
    request = TuneRequest(**raw)
    target = TrialTarget(**spec["target"])
    torch.set_num_threads(int(spec["threads"]))
    try:
        base = _base(request)
        space = search_space(request, base, read_manifest(request.dataset))
        study = open_study(request.out, request.metric, int(spec["seed"]), request.pruner,
                           request.trials)
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        study.optimize(make_objective(target, base, space, target_tracker(target)),
                       timeout=request.timeout_s,
                       callbacks=[optuna.study.MaxTrialsCallback(int(spec["total"]),
                                                                 states=states)])
    except CtrctlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
