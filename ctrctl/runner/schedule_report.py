"""The report of a schedule: one record per trained day, a table and plots.

Per day d (the model trained on day d, judged on day d+1):

- next-day AUC, logloss and calibration (predicted over observed clicks) of the
  warm-started model, and of the comparison arms when the schedule has them;
- the new-id share: per sparse feature, the share of day d+1's lookups whose id is in no
  training day's rows so far (raw keys for zch features; for hashed or vocabulary
  features, ids after hashing or lookup, so collisions hide some new ids);
- zch occupancy and evictions (cumulative, from the first day: the remappers are
  warm-started too) of every managed-collision table;
- training time (the train step's wall time when it ran);
- the registered version, the promotion decision and the champion after the day.

Written to ``WORKDIR/report``: ``days.json`` (the records), ``days.md`` (the table) and
``auc.png``, ``logloss.png``, ``calibration.png``, ``train_seconds.png``, ``ids.png``;
with tracking, logged to the schedule's MLflow run (metrics by day as the step, the
folder as the ``report`` artifact).

Example:
    >>> records = json.loads(Path("runs/continual-demo/report/days.json").read_text())
    >>> [(r["day"], r["auc"], r["arms"]["full_retrain"]["auc"]) for r in records]
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.io import read_json_file, staged_folder
from ctrctl.runner.core import RunResult
from ctrctl.tracking import Run

__all__ = ["day_record", "markdown_table", "write_report"]

logger = logging.getLogger(__name__)

#: Figures of a day plotted and logged to MLflow, as they are named in its record.
FIGURES = ("auc", "logloss", "calibration")


def _numbers(summary: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def day_record(day: int, files: Sequence[Path], result: RunResult,
               arms: dict[str, dict[str, Any]], folder: Path,
               before: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What day ``day`` (1-based) did, from its run's step summaries.

    Args:
        day: the trained day. files: every day's raw log. result: the day's run.
        arms: comparison arm -> its next-day figures. folder: the schedule's working folder.
        before: the records of the days before (for the champion when this day did not
            register).
    """
    summaries = {o.name: o.summary for o in result.outcomes}
    evaluated, train = summaries.get("eval", {}), summaries.get("train", {})
    rows, reg = summaries.get("preprocess", {}), summaries.get("register", {})
    version = reg.get("version")
    if version is None:
        decision = None
    elif not reg.get("alias_moved"):
        decision = "gates failed"
    else:
        decision = "champion" if reg.get("champion") else "kept"
    champion = (str(version) if decision == "champion"
                else reg.get("champion_version") or (before[-1]["champion"] if before else None))
    record: dict[str, Any] = {
        "day": day, "trained_on": files[day - 1].name, "scored_on": files[day].name,
        **{k: evaluated.get(k) for k in FIGURES}, "gates_passed": evaluated.get("gates_passed"),
        "rows_trained": rows.get("rows.train"), "rows_scored": rows.get("rows.test"),
        "train_seconds": train.get("seconds"), "steps": {o.name: o.status for o in
                                                         result.outcomes},
        "version": str(version) if version is not None else None, "decision": decision,
        "candidate_score": reg.get("candidate_score"),
        "champion_score": reg.get("champion_score"), "champion": champion,
        "zch": _collisions(folder / "days" / f"day-{day}" / "train" / "metrics.json"),
        "arms": {name: {k: v for k, v in _numbers(arm).items()
                        if k in (*FIGURES, "train_seconds", "rows_trained", "seconds")}
                 for name, arm in arms.items()},
    }
    if day == 1:  # the arms equal the day's own model on its first day
        record["arms"] = {name: {**{k: record[k] for k in FIGURES},
                                 "train_seconds": record["train_seconds"],
                                 "rows_trained": record["rows_trained"]} for name in arms}
    return record


def _collisions(metrics_json: Path) -> dict[str, float]:
    if not metrics_json.is_file():
        return {}
    zch = read_json_file(metrics_json).get("collisions") or {}
    return {k.removeprefix("zch."): float(v) for k, v in zch.items()
            if k.endswith((".occupancy", ".evictions", ".default_rate"))}


def _split_ids(dataset: Path, splits: Any, split: str, name: str) -> np.ndarray:
    """Every id of sparse feature ``name`` in one split (flattened when multi-hot)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if split not in splits:
        return np.empty(0, dtype=np.int64)
    column = pq.read_table(dataset / split, columns=[name]).column(name)
    if str(column.type).startswith(("list", "large_list")):
        column = pc.list_flatten(column)
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def new_id_shares(folder: Path, days: int) -> list[dict[str, float]]:
    """Per trained day, feature -> share of the next day's ids unseen in training so far."""
    from ctrctl.data.manifest import DatasetManifest

    seen: dict[str, np.ndarray] = {}
    shares: list[dict[str, float]] = []
    for day in range(1, days + 1):
        dataset = folder / "days" / f"day-{day}" / "dataset"
        manifest = DatasetManifest.load(dataset)
        share = {}
        for f in manifest.sparse:
            trained = np.concatenate([_split_ids(dataset, manifest.splits, s, f.name)
                                      for s in ("train", "val")])
            seen[f.name] = np.union1d(seen.get(f.name, np.empty(0, dtype=np.int64)), trained)
            scored = _split_ids(dataset, manifest.splits, "test", f.name)
            share[f.name] = (float(np.mean(~np.isin(scored, seen[f.name]))) if scored.size
                             else 0.0)
        shares.append(share)
    return shares


def markdown_table(records: Sequence[dict[str, Any]], arms: Sequence[str]) -> str:
    """The per-day table (Markdown)."""
    def num(value: Any, digits: int = 4) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    head = ["day", "scored on", "AUC", "logloss", "calibration", "train s"]
    for arm in arms:
        head += [f"{arm} AUC", f"{arm} s"] if arm == "full_retrain" else [f"{arm} AUC"]
    head += ["new-id share (max)", "zch occupancy", "zch evictions", "version", "decision",
             "champion"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        cells = [str(r["day"]), r["scored_on"], num(r["auc"]), num(r["logloss"]),
                 num(r["calibration"], 3), num(r["train_seconds"], 1)]
        for arm in arms:
            a = r["arms"].get(arm, {})
            cells.append(num(a.get("auc")))
            if arm == "full_retrain":
                cells.append(num(a.get("train_seconds"), 1))
        shares = r.get("new_id_share") or {}
        zch = r.get("zch") or {}
        occupancy = ", ".join(f"{k.split('.')[0]} {v:.0%}" for k, v in zch.items()
                              if k.endswith(".occupancy"))
        evictions = ", ".join(f"{k.split('.')[0]} {v:,.0f}" for k, v in zch.items()
                              if k.endswith(".evictions"))
        cells += [num(max(shares.values()) if shares else None, 3), occupancy, evictions,
                  r["version"] or "", r["decision"] or "", r["champion"] or ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _line_plot(path: Path, days: list[int], series: dict[str, list[float | None]],
               ylabel: str, title: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4))
    ax = fig.add_subplot()
    for label, values in series.items():
        points = [(d, v) for d, v in zip(days, values, strict=True) if v is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", linewidth=1.5, label=label)
    ax.set_xlabel("trained on day (scored on the next)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(days)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(records: list[dict[str, Any]], out: Path, arms: Sequence[str],
                 run: Run) -> Path:
    """Add the new-id shares to ``records``, write the report folder, log it to ``run``."""
    for record, share in zip(records, new_id_shares(out.parent, len(records)), strict=True):
        record["new_id_share"] = share
    days = [r["day"] for r in records]

    def series(key: str) -> dict[str, list[float | None]]:
        lines = {"incremental (warm start)": [r[key] for r in records]}
        for arm in arms:
            lines[arm.replace("_", " ")] = [r["arms"].get(arm, {}).get(key) for r in records]
        return lines

    with staged_folder(out, overwrite=True) as stage:
        (stage / "days.json").write_text(json.dumps(records, indent=2, default=str) + "\n")
        (stage / "days.md").write_text(markdown_table(records, arms))
        _line_plot(stage / "auc.png", days, series("auc"), "AUC", "Next-day AUC")
        _line_plot(stage / "logloss.png", days, series("logloss"), "logloss",
                   "Next-day logloss")
        _line_plot(stage / "calibration.png", days, series("calibration"),
                   "predicted / observed clicks", "Next-day calibration")
        times = {"incremental (warm start)": [r["train_seconds"] for r in records]}
        if "full_retrain" in arms:
            times["full retrain"] = [r["arms"].get("full_retrain", {}).get("train_seconds")
                                     for r in records]
        _line_plot(stage / "train_seconds.png", days, times, "seconds", "Training time")
        ids: dict[str, list[float | None]] = {}
        for name in records[0]["new_id_share"]:
            ids[f"new ids: {name}"] = [r["new_id_share"].get(name) for r in records]
        for key in records[-1]["zch"]:
            if key.endswith(".occupancy"):
                ids[f"zch occupancy: {key.split('.')[0]}"] = [r["zch"].get(key) for r in records]
        _line_plot(stage / "ids.png", days, ids, "share", "New ids and zch occupancy")
    for r in records:
        metrics = {f"day.{k}": r[k] for k in (*FIGURES, "train_seconds") if r[k] is not None}
        metrics |= {f"{arm}.{k}": v for arm, a in r["arms"].items() for k, v in a.items()
                    if v is not None}
        metrics |= {f"new_id_share.{k}": v for k, v in r["new_id_share"].items()}
        metrics |= {f"zch.{k}": v for k, v in r["zch"].items()}
        run.log_metrics(metrics, step=r["day"])
    last = records[-1]
    run.set_tags({"ctrctl.schedule.days": str(len(records)),
                  **({"ctrctl.schedule.champion": last["champion"]} if last["champion"] else {})})
    run.log_artifact(out, "report")
    logger.info("schedule report in %s", out)
    return out
