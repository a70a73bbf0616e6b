"""Managed-collision tables through preprocess -> train -> quantize -> export: the artifact
scores raw rows (ids unseen in training included) as the trained model does, in ctrctl and
in a process where ctrctl cannot load."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from ctrctl.config import load_config
from ctrctl.data.dataset import BatchLoader
from ctrctl.data.preprocess import preprocess
from ctrctl.inference.export import load_artifact, write_artifact
from ctrctl.inference.predictor import batch_inputs
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.models.scoring import load_model
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train

from .conftest import OVERRIDES

pytestmark = pytest.mark.slow  # one preprocess -> train -> quantize -> export: ~25 s

SCHEMA = """\
name: zch
format: csv
header: true
label: click
columns:
  - {name: click, role: label}
  - {name: n1, role: dense, type: int}
  - {name: user, role: sparse, type: string,
     collision: {kind: zch, capacity: 40, eviction: lru}}
  - {name: dev, role: sparse, type: hex,
     collision: {kind: zch, capacity: 24, eviction: lfu, admit_min_count: 2}}
  - {name: site, role: sparse, type: int, hash_size: 31}
"""
COLUMNS = ["click", "n1", "user", "dev", "site"]


def _rows(rng: np.random.Generator, n: int, users: list[str], devs: list[str]
          ) -> list[list[str]]:
    rows = []
    for _ in range(n):
        user = str(rng.choice(users)) if rng.random() > 0.05 else ""
        dev = str(rng.choice(devs))
        click = int(rng.random() < (0.7 if len(user) % 3 == 0 else 0.2))
        rows.append([str(click), str(int(rng.integers(0, 300))), user, dev,
                     str(int(rng.integers(0, 1000)))])
    return rows


@dataclass(frozen=True)
class Exported:
    export: Path
    run: Path
    test_csv: Path
    dataset: Path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    root = tmp_path_factory.mktemp("zch")
    rng = np.random.default_rng(11)
    users = [f"user-{i}-{'x' * (i % 5)}" for i in range(90)]  # more users than rows
    devs = [f"{int(k):016x}" for k in rng.integers(0, 2**63, 40)] + ["ffffffffffffffff"]
    splits = {"train": (1500, users[:70]), "test": (300, users[40:])}  # 20 unseen users
    for split, (n, pool) in splits.items():
        with open(root / f"{split}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            writer.writerows(_rows(rng, n, pool, devs))
    (root / "schema.yaml").write_text(SCHEMA)
    dataset = root / "dataset"
    preprocess(root / "schema.yaml", [f"train={root / 'train.csv'}",
                                      f"test={root / 'test.csv'}"], dataset)
    with torch_threads(1):
        run = train(dataset, root / "run", load_config(None, [*OVERRIDES, "training.epochs=1"]))
        quantized = quantize_checkpoint(run.checkpoint, QuantizeConfig(dtype="fp16",
                                                                       num_shards=2))
    export = write_artifact(quantized, root / "export", dataset=dataset)
    return Exported(export, Path(run.checkpoint), root / "test.csv", dataset)


def _records(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _trained_scores(exported: Exported) -> torch.Tensor:
    model, _, _ = load_model(exported.run)
    batch = next(iter(BatchLoader.for_scoring(exported.dataset, "test", 10_000,
                                              num_workers=0).epoch(0)))
    with torch.no_grad():
        return torch.sigmoid(model(batch.dense, batch.sparse))


def test_the_artifact_scores_raw_rows_as_the_trained_model(exported: Exported) -> None:
    serving = load_artifact(exported.export)
    contract = {f["name"]: f for f in serving.contract["sparse"]}
    assert contract["user"]["mode"] == "zch" and contract["dev"]["mode"] == "zch"
    records = _records(exported.test_csv)
    dense, ids, lengths = serving.encode(records)
    batch = next(iter(BatchLoader.for_scoring(exported.dataset, "test", 10_000,
                                              num_workers=0).epoch(0)))
    _, want_ids, want_lengths = batch_inputs(batch, serving.contract["order"])
    assert torch.equal(ids, want_ids) and torch.equal(lengths, want_lengths)  # raw keys
    scores = torch.tensor(serving.predict_records(records), dtype=torch.float32)
    # fp16 tables: scores agree to fp16's rounding of the embeddings.
    torch.testing.assert_close(scores, _trained_scores(exported), atol=2e-3, rtol=1e-2)
    # Test users never seen in training (a third of the test pool) go to the default row.
    model, _, _ = load_model(exported.run)
    assert model.collisions is not None
    user = serving.contract["order"].index("user")
    keys = want_ids.split(want_lengths.view(len(contract), -1).sum(1).tolist())[user]
    slots = model.collisions.remappers["user"].remap(keys, update=False)
    assert 0.05 < float((slots == 0).double().mean()) < 0.9


def test_standalone_loader_without_ctrctl_scores_the_same(exported: Exported,
                                                         tmp_path: Path) -> None:
    records = _records(exported.test_csv)
    (tmp_path / "rows.json").write_text(json.dumps(records))
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["ctrctl"] = None                 # any import of ctrctl fails
        sys.path = [p for p in sys.path if p not in ("", ".")]
        sys.dont_write_bytecode = True
        sys.path.insert(0, {str(exported.export)!r})
        import serving
        model = serving.load({str(exported.export)!r})
        rows = json.load(open({str(tmp_path / "rows.json")!r}))
        json.dump(model.predict_records(rows).tolist(), open({str(tmp_path / "out.json")!r}, "w"))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = torch.tensor(json.loads((tmp_path / "out.json").read_text()),
                          dtype=torch.float32)
    ours = torch.tensor(load_artifact(exported.export).predict_records(records),
                        dtype=torch.float32)
    torch.testing.assert_close(theirs, ours)
    torch.testing.assert_close(theirs, _trained_scores(exported), atol=2e-3, rtol=1e-2)


def test_serving_counts_default_row_lookups(exported: Exported) -> None:
    """/metrics' ctrctl_zch_default_lookups_total: keys that own no row in the artifact."""
    from ctrctl.serving.batcher import Batcher, Job
    from ctrctl.serving.metrics import Metrics

    serving = load_artifact(exported.export)
    records = _records(exported.test_csv)
    _, ids, lengths = serving.encode(records)
    counted = serving.default_row_lookups(ids, lengths)
    model, _, _ = load_model(exported.run)
    assert model.collisions is not None
    order = serving.contract["order"]
    chunks = ids.split(lengths.view(len(order), -1).sum(1).tolist())
    for name in ("user", "dev"):
        slots = model.collisions.remappers[name].remap(chunks[order.index(name)], update=False)
        assert counted[name] == int((slots == 0).sum())
    assert counted["user"] > 0
    metrics = Metrics()
    batcher = Batcher(serving, metrics, "1")
    columns = {k: [r[k] for r in records] for k in records[0]}
    job = Job(columns, len(records), 0.0, 0.0, None)  # type: ignore[arg-type]
    batcher._count_oov(job, (torch.empty(0), ids, lengths))
    text = metrics.render()[0].decode()
    assert f'ctrctl_zch_default_lookups_total{{feature="user"}} {float(counted["user"])}' in text


def test_serving_reports_zch_occupancy(exported: Exported) -> None:
    """/metrics' ctrctl_zch_occupancy: the artifact's owned rows over the table's rows, as
    the trained remapper's statistics have it."""
    import asyncio

    from ctrctl.serving.config import ServeConfig
    from ctrctl.serving.metrics import Metrics
    from ctrctl.serving.models import load_slot
    from ctrctl.serving.source import ModelSource

    model, _, _ = load_model(exported.run)
    assert model.collisions is not None
    stats = model.collisions.stats()
    serving = load_artifact(exported.export)
    assert serving.zch_occupancy() == pytest.approx(
        {name: stats[name]["occupancy"] for name in ("user", "dev")})
    assert 0 < stats["user"]["occupancy"] <= 1.0
    metrics = Metrics()

    async def load() -> None:
        slot = await load_slot(ModelSource.parse(str(exported.export)), None,
                               ServeConfig(model=str(exported.export)), metrics, "primary")
        await slot.batcher.stop()

    asyncio.run(load())
    text = metrics.render()[0].decode()
    for name in ("user", "dev"):
        line = next(x for x in text.splitlines()
                    if x.startswith(f'ctrctl_zch_occupancy{{feature="{name}"'))
        assert float(line.split()[-1]) == pytest.approx(stats[name]["occupancy"])
