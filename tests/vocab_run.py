"""A small pipeline on synthetic Criteo logs with vocabulary features, shared by fault tests:
raw logs, the dataset, a 10-step training run and its serving artifact."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.config import load_config
from ctrctl.data.synthetic import synthesize
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train
from tests.inference.conftest import OVERRIDES

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Pipeline:
    logs: Path
    dataset: Path
    run: Path
    export: Path


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Pipeline:
    root = tmp_path_factory.mktemp("full-disk")
    logs = root / "logs"
    synthesize(logs, rows=3000, format="criteo", seed=1, splits={"train": 0.8, "test": 0.2})
    p = Pipeline(logs, root / "ds", root / "run", root / "export")
    with torch_threads(1):
        assert main(["preprocess", "--schema", str(ROOT / "schemas" / "criteo_vocab.yaml"),
                     "--input", f"train={logs / 'train.tsv'}", "--input",
                     f"test={logs / 'test.tsv'}", "--out", str(p.dataset), "--no-track"]) == 0
        train(p.dataset, p.run, load_config(None, [*OVERRIDES, "training.epochs=1"]),
              stop_after=10)
        assert main(["quantize", "--checkpoint", str(p.run), "--out", str(p.export),
                     "--no-track"]) == 0
    return p
