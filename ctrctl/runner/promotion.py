"""Champion/challenger promotion of a registered version.

``register.champion_metric`` (``auc`` or ``logloss``) turns it on. A new version that passed
the absolute gates (its ``candidate`` alias moved) is then compared with the version the
``register.champion_alias`` names: both exports score the same eval rows in this run (the
eval split's raw logs, each through its own encoder, so other vocabularies do not matter;
the preprocessed split when it has no raw input of its own), and
the champion alias moves only when the new one is better by more than ``register.min_gain``
(a tie keeps the champion). The first version to pass becomes champion. The version's tags
record the decision and both figures.

Example:
    >>> decide("auc", 0.752, 0.748, min_gain=0.001)
    Decision(promote=True, gain=0.004...)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.metrics.functional import log_loss, roc_auc

__all__ = ["Decision", "decide", "promote", "score_export"]

logger = logging.getLogger(__name__)

#: Metric -> (function of labels and scores, +1 when higher is better).
METRICS = {"auc": (roc_auc, 1.0), "logloss": (log_loss, -1.0)}


@dataclass(frozen=True)
class Decision:
    """Whether the new version becomes champion, by how much it beat (or lost to) the old."""

    promote: bool
    gain: float | None
    candidate: float
    champion: float | None
    champion_version: str | None = None

    def tags(self, metric: str) -> dict[str, str]:
        return {"ctrctl.promotion.decision": "champion" if self.promote else "kept",
                "ctrctl.promotion.metric": metric,
                f"ctrctl.promotion.candidate_{metric}": repr(self.candidate),
                f"ctrctl.promotion.champion_{metric}": repr(self.champion),
                "ctrctl.promotion.champion_version": self.champion_version or "",
                "ctrctl.promotion.gain": repr(self.gain)}


def decide(metric: str, candidate: float, champion: float | None, min_gain: float,
           champion_version: str | None = None) -> Decision:
    """Promote on a real gain: better than the champion by more than ``min_gain``."""
    if champion is None:
        return Decision(True, None, candidate, None, champion_version)
    gain = (candidate - champion) * METRICS[metric][1]
    return Decision(gain > min_gain, gain, candidate, champion, champion_version)


def score_export(folder: Path, dataset: Path, split: str, metric: str) -> float:
    """``metric`` of an export folder's scores on a dataset split.

    Raises:
        DatasetError: the dataset's ids were made with other transforms (vocabularies, hash
            sizes) than the export's: its ids would mean other values to that model.
    """
    import json

    from ctrctl.data.dataset import BatchLoader
    from ctrctl.data.manifest import DatasetManifest
    from ctrctl.inference.export import load_artifact
    from ctrctl.inference.predictor import batch_inputs, check_transforms

    serving = load_artifact(folder)
    recorded = folder / "dataset" / "manifest.json"
    if recorded.is_file():  # preprocess new days with --reuse-transforms of the first
        check_transforms(json.loads(recorded.read_text()), DatasetManifest.load(dataset),
                         str(dataset))
    order = serving.contract["order"]
    labels, scores = [], []
    for batch in BatchLoader.for_scoring(dataset, split, 8192, num_workers=1).epoch(0):
        labels.append(batch.labels.numpy())
        scores.append(serving.score(*batch_inputs(batch, order)).numpy())
    return float(METRICS[metric][0](np.concatenate(labels), np.concatenate(scores)))


def score_raw_logs(folder: Path, raw: list[Path], metric: str) -> float:
    """``metric`` of an export folder's scores on raw logs, encoded by its own encoder (so
    two models with other vocabularies score the same rows)."""
    import tempfile

    import pyarrow.parquet as pq

    from ctrctl.inference.predictor import predict_raw

    labels, scores = [], []
    with tempfile.TemporaryDirectory(prefix="ctrctl-promotion-") as temp:
        for i, path in enumerate(raw):
            out = Path(temp) / f"scores-{i}.parquet"
            predict_raw(folder, path, out, via="encoder")
            table = pq.read_table(out, columns=["label", "score"])
            labels.append(table.column("label").to_numpy())
            scores.append(table.column("score").to_numpy())
    return float(METRICS[metric][0](np.concatenate(labels), np.concatenate(scores)))


def _eval_logs(ctx: Any) -> list[Path]:
    """The raw logs of the eval split, when it came from its own input."""
    from ctrctl.runner.steps import _raw_inputs
    from ctrctl.runner.validate import input_paths

    split = ctx.cfg.runner.eval_split
    return [p for name, matches in input_paths(_raw_inputs(ctx)) if name == split
            for p in matches]


def _score(ctx: Any, folder: Path, metric: str) -> float:
    raw = _eval_logs(ctx)
    if raw:
        return score_raw_logs(folder, raw, metric)
    return score_export(folder, ctx.dataset, ctx.cfg.runner.eval_split, metric)


def _registered_export(name: str, version: str, tracking_uri: str | None) -> Path:
    import tempfile

    import mlflow.artifacts

    stage = Path(tempfile.mkdtemp(prefix="ctrctl-champion-"))
    mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}",
                                        dst_path=str(stage), tracking_uri=tracking_uri)
    found = [p.parent for p in stage.rglob("manifest.json") if p.parent.name == "export"]
    if not found:
        from ctrctl.errors import TrackingError

        raise TrackingError(f"version {version} of {name} holds no export folder",
                            where=f"models:/{name}/{version}")
    return found[0]


def promote(ctx: Any, name: str, version: str) -> Decision:
    """Compare ``version`` (just registered, gates passed) with the champion; move the
    champion alias on a real gain; tag the version with the decision."""
    from mlflow.tracking import MlflowClient

    reg = ctx.cfg.register
    metric = reg.champion_metric
    uri = ctx.tracking_uri or getattr(ctx.tracker, "tracking_uri", None)
    client = MlflowClient(tracking_uri=uri)
    candidate = _score(ctx, ctx.export, metric)
    try:
        current = str(client.get_model_version_by_alias(name, reg.champion_alias).version)
    except Exception:  # MlflowException: no such alias yet
        current = None
    champion = (_score(ctx, _registered_export(name, current, uri), metric)
                if current is not None else None)
    decision = decide(metric, candidate, champion, reg.min_gain, current)
    if decision.promote:
        client.set_registered_model_alias(name, reg.champion_alias, version)
    for key, value in decision.tags(metric).items():
        client.set_model_version_tag(name, version, key, value)
    logger.info("promotion: version %s %s (%s %.5f against %s)", version,
                "is champion" if decision.promote else "kept the champion", metric,
                candidate, champion)
    return decision
