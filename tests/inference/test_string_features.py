"""Raw rows with string categoricals: the standalone loader hashes them as preprocess did.

A hand-made log (synthetic strings of every length class of the hash, non-ASCII, lists and
missing values) goes through preprocess -> train -> quantize -> export; the standalone
loader's encoding of the raw rows must give the preprocessed split's ids exactly, and its
scores must be ``ctrctl predict --input``'s, also in a process where ctrctl cannot load.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from ctrctl.config import load_config
from ctrctl.data.dataset import BatchLoader
from ctrctl.data.preprocess import preprocess
from ctrctl.inference.export import load_artifact, write_artifact
from ctrctl.inference.predictor import batch_inputs, predict_raw
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.inference.standalone import ArtifactError
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train

from .conftest import OVERRIDES

SCHEMA = """\
name: strings
format: csv
header: true
label: click
columns:
  - {name: click, role: label}
  - {name: n1, role: dense, type: int}
  - {name: site, role: sparse, type: string, hash_size: 97}
  - {name: tags, role: sparse, type: string, hash_size: 53, multi_hot_separator: "|"}
  - {name: city, role: sparse, type: string, min_count: 3}
  - {name: dev, role: sparse, type: hex, hash_size: 31}
"""
COLUMNS = ["click", "n1", "site", "tags", "city", "dev"]


def _words(rng: np.random.Generator, n: int) -> list[str]:
    """n distinct strings over the hash's length classes, some not ASCII."""
    alphabet = list("abcdefghijklmnopqrstuvwxyz0123456789 -_.é漢🙂")
    lengths = rng.choice([1, 2, 3, 5, 8, 12, 16, 30, 70, 150, 260], size=n)
    words = {"".join(rng.choice(alphabet, size=int(k))).strip() or "w" for k in lengths}
    return sorted(words)


def _rows(rng: np.random.Generator, n: int, pools: dict[str, list[str]]) -> list[list[str]]:
    rows = []
    for _ in range(n):
        site = str(rng.choice(pools["site"])) if rng.random() > 0.1 else ""
        tags = "|".join(str(t) for t in rng.choice(pools["tags"], size=int(rng.integers(0, 4))))
        city = str(rng.choice(pools["city"])) if rng.random() > 0.05 else ""
        dev = f"{int(rng.integers(0, 2**32)):08x}"
        click = int(rng.random() < (0.7 if hash(site) % 3 == 0 else 0.2))
        rows.append([str(click), str(int(rng.integers(-2, 500))), site, tags, city, dev])
    return rows


@dataclass(frozen=True)
class Exported:
    export: Path
    test_csv: Path
    dataset: Path


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    root = tmp_path_factory.mktemp("strings")
    rng = np.random.default_rng(7)
    pools = {"site": _words(rng, 60), "tags": _words(rng, 25), "city": _words(rng, 15)}
    for split, n in (("train", 1200), ("test", 300)):
        with open(root / f"{split}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            writer.writerows(_rows(rng, n, pools))
    (root / "schema.yaml").write_text(SCHEMA)
    dataset = root / "dataset"
    preprocess(root / "schema.yaml", [f"train={root / 'train.csv'}",
                                      f"test={root / 'test.csv'}"], dataset)
    with torch_threads(1):
        run = train(dataset, root / "run", load_config(None, [*OVERRIDES, "training.epochs=1"]))
        quantized = quantize_checkpoint(run.checkpoint, QuantizeConfig(dtype="int8",
                                                                       num_shards=2))
    export = write_artifact(quantized, root / "export", dataset=dataset)
    return Exported(export, root / "test.csv", dataset)


def _records(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_raw_string_rows_encode_to_the_preprocessed_ids(exported: Exported) -> None:
    serving = load_artifact(exported.export)
    contract = {f["name"]: f for f in serving.contract["sparse"]}
    assert contract["site"]["mode"] == "hash" and contract["site"]["type"] == "string"
    assert contract["tags"]["probes"] and serving.contract["string_hash"]["library"] == "polars"
    records = _records(exported.test_csv)
    dense, ids, lengths = serving.encode(records)
    batch = next(iter(BatchLoader.for_scoring(exported.dataset, "test", 10_000,
                                              num_workers=0).epoch(0)))
    want_dense, want_ids, want_lengths = batch_inputs(batch, serving.contract["order"])
    assert torch.equal(lengths, want_lengths)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(dense, want_dense)
    # The string features are really hashed: many distinct ids, not all missing (0).
    site = serving.contract["order"].index("site")
    per_feature = ids.split(lengths.view(len(contract), -1).sum(1).tolist())
    assert len(set(per_feature[site].tolist())) > 20


def test_standalone_scores_raw_string_rows_as_ctrctl_predicts(exported: Exported,
                                                              tmp_path: Path) -> None:
    predict_raw(exported.export, exported.test_csv, tmp_path / "scores.parquet")
    ctrctl_scores = torch.from_numpy(
        pq.read_table(tmp_path / "scores.parquet").column("score").to_numpy().copy())
    records = _records(exported.test_csv)
    mine = torch.tensor(load_artifact(exported.export).predict_records(records),
                        dtype=torch.float32)
    torch.testing.assert_close(mine, ctrctl_scores)

    (tmp_path / "rows.json").write_text(json.dumps(records))
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["ctrctl"] = None                 # any import of ctrctl fails
        sys.path = [p for p in sys.path if p not in ("", ".")]
        sys.dont_write_bytecode = True  # no __pycache__ in the folder: its files are listed
        sys.path.insert(0, {str(exported.export)!r})
        import serving
        model = serving.load({str(exported.export)!r})
        rows = json.load(open({str(tmp_path / "rows.json")!r}))
        json.dump(model.predict_records(rows).tolist(), open({str(tmp_path / "out.json")!r}, "w"))
        print("ctrctl modules:", [m for m in sys.modules if m.startswith("ctrctl")
                                  and sys.modules[m]])
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ctrctl modules: []" in result.stdout
    theirs = torch.tensor(json.loads((tmp_path / "out.json").read_text()),
                          dtype=torch.float32)
    torch.testing.assert_close(theirs, ctrctl_scores)


def test_a_string_hash_that_differs_is_refused(exported: Exported) -> None:
    serving = load_artifact(exported.export)
    feature = next(f for f in serving.contract["sparse"] if f["name"] == "site")
    probe, expected = feature["probes"][3]
    feature["probes"][3] = [probe, (expected + 1) % feature["num_embeddings"]]
    with pytest.raises(ArtifactError, match="hashes strings differently"):
        serving.predict_records(_records(exported.test_csv)[:3])
