"""The judge's second look: the search's finalists retrained on fresh val samples.

On a small set the carved val split is a few hundred rows, and among 30 trials the one with
the best val metric is mostly the one that fitted that sample's noise best (measured on the
shared samples: the val winner lost to the defaults on test on Avazu and Criteo). So after
the search the ``finalists`` best completed trials, and the base config's trial, are each
trained again on ``holdouts`` other splits of the same rows, and the winner is the
candidate with the best **mean over the holdouts**. The search's own val metric does not
count: the finalists were picked by it, so it flatters them (on the Criteo sample every
finalist beat the defaults on val and lost to them on both holdouts).

A holdout split keeps the train split's size: its val rows are a fresh draw of as many rows
as the val split holds, taken from train (disjoint from val and from the other holdouts);
its train rows are all the others (the original val rows included). Only the train and val
splits' files are read, so the test split stays unread. The winner's ``best/`` is its own
search trial (trained on the dataset's train split, stopped early on its val split), so the
checkpoint records the dataset's own hash.

Cost: ``(finalists + 1) * holdouts`` trainings, none pruned, run after the search. Results
are kept in ``DIR/recheck.json`` as they come, so a rerun of a killed search retrains none
of them.

Example:
    >>> views = holdout_views(Path("runs/tune/.view"), Path("runs/tune/.holdouts"), "val", 2)
    >>> len(views)
    2
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctrctl.config import parse_config
from ctrctl.io import read_json_file, staged_folder, write_json_atomic
from ctrctl.tuning.trial import read_manifest

__all__ = ["Candidate", "describe", "holdout_views", "recheck"]

logger = logging.getLogger(__name__)

#: The record of holdout metrics: ``{"trial N": {"h0": value, ...}}``.
RECORD = "recheck.json"


@dataclass(frozen=True)
class Candidate:
    """One finalist and what the recheck measured.

    Attributes:
        number: its trial number.
        base: whether it is the base config's trial.
        values: its val metric on the search's split, then on each holdout split.
    """

    number: int
    base: bool
    values: tuple[float, ...]

    @property
    def score(self) -> float:
        """The mean over the holdouts. The search's own val metric is left out: the
        finalists were chosen by it, so it is biased in their favour (the base's is not)."""
        return statistics.fmean(self.values[1:] or self.values)


def holdout_views(view: Path, folder: Path, val_split: str, holdouts: int,
                  seed: int = 0) -> list[Path]:
    """``holdouts`` datasets of the train and val rows of ``view``, each with a fresh val.

    Each holds a manifest (the dataset's, with only ``train`` and ``val`` splits, their rows
    and files replaced) and one Parquet file per split. Existing complete ones are reused.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = read_manifest(view)
    train_info, val_info = manifest.split("train"), manifest.split(val_split)
    wanted = [folder / f"h{i}" for i in range(holdouts)]
    if all((p / "manifest.json").is_file() for p in wanted):
        return wanted
    train = pa.concat_tables([pq.read_table(view / f) for f in train_info.files])
    val = pa.concat_tables([pq.read_table(view / f) for f in val_info.files])
    rows = pa.concat_tables([train, val.cast(train.schema)])
    # each holdout's val: as many rows as val holds, drawn from train, disjoint draws
    size = min(val.num_rows, train.num_rows // (holdouts + 1))
    order = np.random.default_rng(seed).permutation(train.num_rows)
    data = json.loads((view / "manifest.json").read_text())
    for i, path in enumerate(wanted):
        picked = np.zeros(rows.num_rows, dtype=bool)
        picked[order[i * size:(i + 1) * size]] = True
        parts = {"train": rows.filter(pa.array(~picked)),
                 val_split: rows.filter(pa.array(picked))}
        splits = {}
        with staged_folder(path, overwrite=True) as tmp:
            for name, table in parts.items():
                (tmp / name).mkdir()
                pq.write_table(table, tmp / name / "part-00000.parquet")
                labels = table.column("label").to_numpy() if "label" in table.column_names \
                    else np.zeros(1)
                splits[name] = {"files": [f"{name}/part-00000.parquet"],
                                "rows": table.num_rows, "label_rate": float(labels.mean())}
            write_json_atomic(tmp / "manifest.json", {**data, "splits": splits})
    return wanted


def _candidates(study: Any, finalists: int) -> list[Any]:
    """The ``finalists`` best completed trials, plus the base config's trial when it
    completed (in the study's order of merit)."""
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    reverse = study.direction.name == "MAXIMIZE"
    done.sort(key=lambda t: t.value, reverse=reverse)
    chosen = [t for t in done if not t.user_attrs.get("base")][:finalists]
    chosen += [t for t in done if t.user_attrs.get("base")][:1]
    return sorted(chosen, key=lambda t: t.value, reverse=reverse)


def recheck(study: Any, out: Path, view: Path, metric: str, val_split: str,
            finalists: int, holdouts: int, seed: int = 0) -> tuple[int, list[Candidate]]:
    """Train the finalists on the holdout splits; the trial with the best holdout mean, and
    every candidate.

    Returns the winner's trial number and every candidate (best first). With fewer than two
    candidates, or ``holdouts`` 0, the search's best trial wins unchecked.
    """
    from ctrctl.training.loop import train

    trials = _candidates(study, finalists)
    if len(trials) < 2 or holdouts < 1:
        best = study.best_trial
        return best.number, [Candidate(best.number, bool(best.user_attrs.get("base")),
                                       (float(best.value),))]
    views = holdout_views(view, out / ".holdouts", val_split, holdouts, seed)
    record_path = out / RECORD
    record: dict[str, dict[str, float]] = read_json_file(record_path) \
        if record_path.is_file() else {}
    candidates = []
    for t in trials:
        config = parse_config(json.loads(Path(t.user_attrs["config"]).read_text()))
        mine = record.setdefault(f"trial {t.number}", {})
        for i, holdout in enumerate(views):
            if f"h{i}" not in mine:
                res = train(holdout, out / "recheck" / f"{t.number:04d}" / f"h{i}", config,
                            overwrite=True)
                mine[f"h{i}"] = float(res.metrics[metric])
                write_json_atomic(record_path, record)
        values = (float(t.value), *(mine[f"h{i}"] for i in range(len(views))))
        candidates.append(Candidate(t.number, bool(t.user_attrs.get("base")), values))
    reverse = study.direction.name == "MAXIMIZE"
    candidates.sort(key=lambda c: c.score, reverse=reverse)
    for c in candidates:
        logger.info("recheck: trial %d%s %s mean %.5f over %s", c.number,
                    " (base)" if c.base else "", metric, c.score,
                    ", ".join(f"{v:.5f}" for v in c.values))
    return candidates[0].number, candidates


def describe(candidates: Sequence[Candidate]) -> list[dict[str, Any]]:
    """The candidates as rows (for the result and the parent run)."""
    return [{"trial": c.number, "base": c.base, "mean": c.score, "values": list(c.values)}
            for c in candidates]
