"""The retrieval export: the INT8 query tower beside the index, hashed, verified at load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ctrctl.cli.app import app
from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.errors import CheckpointError
from ctrctl.inference.retrieval import export_retrieval, load_retrieval, quantize_query_tower
from ctrctl.models.scoring import load_model
from ctrctl.models.two_tower import embed, item_catalogue, kjt_from_frame
from ctrctl.retrieval.indexing import index_checkpoint
from ctrctl.retrieval.synthetic import synthesize_two_tower
from ctrctl.training.loop import train

OVERRIDES = [
    "model.kind=two_tower", "model.embedding_dim=16", "model.query_tower.layers=[16]",
    "model.item_tower.layers=[16]", "training.batch_size=128", "training.epochs=2",
    "training.val_every=0", "training.num_workers=1", "training.device=cpu",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tt")
    synthesize_two_tower(root / "logs", users=300, items=200, per_user=8, dim=4,
                         temperature=0.2, seed=3)
    preprocess(root / "logs" / "schema.yaml", [str(root / "logs" / "interactions.tsv")],
               root / "ds")
    train(root / "ds", root / "run", load_config(None, OVERRIDES))
    index_checkpoint(root / "run", root / "index", kind="flat")
    return root


def test_int8_query_tower_follows_the_fp32_tower(run: Path) -> None:
    model, manifest, _ = load_model(run / "run")
    users = torch.arange(1, 301)
    import polars as pl

    frame = pl.DataFrame({"user": users.numpy()})
    kjt = kjt_from_frame(frame, ["user"])
    fp32 = embed(model, frame, "query")                                    # (300, 16)
    int8 = quantize_query_tower(model, "int8").embed_ids(kjt.values(), kjt.lengths())
    cosine = (fp32 * int8).sum(1)
    assert float(cosine.min()) > 0.99
    assert torch.allclose(int8.norm(dim=1), torch.ones(300), atol=1e-5)


def test_export_retrieves_as_exact_search_and_reports_the_cost(run: Path) -> None:
    exported = export_retrieval(run / "run", run / "index", run / "export")
    m = exported.manifest
    assert m["kind"] == "two_tower_retrieval" and m["dtype"] == "int8"
    assert exported.quantized_bytes < exported.fp32_bytes / 3   # 16 + 4 bytes vs 64 a row
    assert 0.9 <= m["overlap@100"] <= 1.0 and m["cosine"] > 0.99
    loaded = load_retrieval(run / "export")
    model, manifest, _ = load_model(run / "run")
    catalogue = item_catalogue(run / "ds", manifest)
    items = embed(model, catalogue.features, "item")
    # raw user ids, as a request carries them (int keys hashed as the preprocess step did)
    scores, found = loaded.retrieve({"user": ["7", "42"]}, 10, rows=2)
    assert found.shape == (2, 10) and set(found.ravel().tolist()) <= set(catalogue.ids.tolist())
    queries = loaded.embed({"user": [7, 42]}, 2)
    exact = (queries @ items.T).topk(10, dim=1)
    assert np.array_equal(found, catalogue.ids[exact.indices].numpy())
    assert np.allclose(scores, exact.values.numpy(), atol=1e-5)


def test_a_changed_file_or_another_checkpoints_index_is_refused(run: Path,
                                                                tmp_path: Path) -> None:
    export_retrieval(run / "run", run / "index", tmp_path / "e")
    ids = tmp_path / "e" / "item_ids.npy"
    np.save(ids, np.load(ids)[::-1].copy())
    with pytest.raises(CheckpointError, match="item_ids.npy does not match its sha256"):
        load_retrieval(tmp_path / "e")
    other = tmp_path / "index"
    index_checkpoint(run / "run", other, kind="flat")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["checkpoint_sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="another checkpoint"):
        export_retrieval(run / "run", other, tmp_path / "e2")


def test_quantize_cli_exports_a_two_tower_with_its_index(run: Path, tmp_path: Path) -> None:
    cli = CliRunner()
    done = cli.invoke(app, ["quantize", "--checkpoint", str(run / "run"), "--out",
                            str(tmp_path / "x"), "--no-track"])
    assert done.exit_code == 1 and "--index" in str(done.exception)
    done = cli.invoke(app, ["quantize", "--checkpoint", str(run / "run"), "--index",
                            str(run / "index"), "--out", str(tmp_path / "q"), "--dtype",
                            "int4", "--no-track"])
    assert done.exit_code == 0, done.output
    assert "overlap@100" in done.output
    assert json.loads((tmp_path / "q" / "manifest.json").read_text())["dtype"] == "int4"
