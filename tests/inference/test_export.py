"""The serving artifact: verified loading, no unpickling, runs without ctrctl, batch scoring."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import DatasetError, OutputExistsError
from ctrctl.inference import standalone
from ctrctl.inference.export import load_artifact, write_artifact
from ctrctl.inference.predictor import batch_inputs, predict_dataset
from ctrctl.inference.quantize import QuantizeConfig, QuantizedModel, quantize_checkpoint
from ctrctl.io import temp_path, tree_sha256

from .conftest import Trained


@pytest.fixture(scope="module")
def quantized(trained: Trained) -> QuantizedModel:
    return quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", num_shards=2,
                                                           per_table={"C5": "int4"}))


@pytest.fixture(scope="module")
def artifact(quantized: QuantizedModel, trained: Trained,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_artifact(quantized, tmp_path_factory.mktemp("export") / "export",
                          dataset=trained.dataset.path)


def _copy(artifact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifact, tmp_path / "copy"))


def test_artifact_files_and_manifest(artifact: Path, trained: Trained) -> None:
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert set(manifest["files"]) >= {"program.pt2", "dense.safetensors", "serving_plan.json",
                                      "serving.py", "tables/shard-00000.safetensors",
                                      "tables/shard-00001.safetensors",
                                      "dataset/manifest.json"}
    hashes = manifest["hashes"]
    assert hashes["dataset_manifest"] == trained.dataset.manifest.content_hash()
    assert len(hashes["checkpoint"]) == 64 and len(hashes["serving_plan"]) == 64
    assert manifest["quantization"]["per_table"] == {"C5": "int4"}
    contract = manifest["input"]
    assert sorted(contract["order"]) == ["C1", "C2", "C3", "C4", "C5"]
    assert [f["name"] for f in contract["sparse"]] == contract["order"]
    assert [f["num_embeddings"] for f in contract["sparse"] if f["name"] == "C5"] == [200]
    assert [d["name"] for d in contract["dense"]] == trained.dataset.manifest.dense_names
    # The program file holds no weights and no example inputs (nothing to unpickle).
    import zipfile

    with zipfile.ZipFile(artifact / "program.pt2") as archive:
        weights = [i for i in archive.infolist() if "/data/weights/weight_" in i.filename
                   or "sample_inputs" in i.filename]
    assert weights and all(i.file_size == 0 for i in weights)


def test_loaded_artifact_scores_as_eager_bitwise(artifact: Path, quantized: QuantizedModel,
                                                 trained: Trained) -> None:
    serving = load_artifact(artifact)
    batch = next(iter(BatchLoader.for_scoring(trained.dataset.path, "test", 128,
                                              num_workers=0).epoch(0)))
    inputs = batch_inputs(batch, serving.contract["order"])
    assert torch.equal(serving.score(*inputs), quantized.model(*inputs))


def test_loading_unpickles_nothing(artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    serving = load_artifact(artifact)
    assert serving.score(*serving.encode([{}])).shape == (1,)


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap", "missing", "manifest"])
def test_damaged_artifact_is_a_clear_error(artifact: Path, tmp_path: Path, damage: str) -> None:
    copy = _copy(artifact, tmp_path)
    shard0, shard1 = copy / "tables/shard-00000.safetensors", copy / "tables/shard-00001.safetensors"
    expected = "shard-00000"
    if damage == "flip":
        data = bytearray(shard0.read_bytes())
        data[-3] ^= 0xFF
        shard0.write_bytes(bytes(data))
        expected = "sha256 differs"
    elif damage == "truncate":
        shard0.write_bytes(shard0.read_bytes()[:-10])
        expected = "truncated"
    elif damage == "swap":
        a, b = shard0.read_bytes(), shard1.read_bytes()
        shard0.write_bytes(b)
        shard1.write_bytes(a)
        expected = "shard-0000"
    elif damage == "missing":
        (copy / "program.pt2").unlink()
        expected = "program.pt2: missing"
    else:
        (copy / "manifest.json").write_text("{")
        expected = "not valid JSON"
    with pytest.raises(standalone.ArtifactError, match=expected):
        load_artifact(copy)


def test_ids_out_of_range_are_refused(artifact: Path) -> None:
    serving = load_artifact(artifact)
    dense, ids, lengths = serving.encode([{}])
    ids[0] = 10_000
    with pytest.raises(standalone.ArtifactError, match="outside"):
        serving.score(dense, ids, lengths)


def test_runs_in_a_process_without_ctrctl(artifact: Path, quantized: QuantizedModel,
                                          trained: Trained, tmp_path: Path) -> None:
    batch = next(iter(BatchLoader.for_scoring(trained.dataset.path, "test", 50,
                                              num_workers=0).epoch(0)))
    dense, ids, lengths = batch_inputs(batch, quantized.model.input_features)
    from safetensors.torch import save_file

    save_file({"dense": dense.contiguous(), "ids": ids.contiguous(),
               "lengths": lengths.contiguous()}, str(tmp_path / "request.safetensors"))
    script = textwrap.dedent(f"""
        import sys
        sys.modules["ctrctl"] = None                 # any import of ctrctl fails
        sys.path = [p for p in sys.path if p not in ("", ".")]
        sys.dont_write_bytecode = True  # no __pycache__ in the folder: its files are listed
        sys.path.insert(0, {str(artifact)!r})
        import serving, torch
        from safetensors.torch import load_file, save_file
        model = serving.load({str(artifact)!r})
        request = load_file({str(tmp_path / "request.safetensors")!r})
        scores = model.score(request["dense"], request["ids"], request["lengths"])
        fast = serving.load({str(artifact)!r}, compile=True)  # TorchInductor, still no ctrctl
        compiled = fast.score(request["dense"], request["ids"], request["lengths"])
        save_file({{"scores": scores, "compiled": compiled}},
                  {str(tmp_path / "scores.safetensors")!r})
        loaded = [m for m in sys.modules if m.startswith("ctrctl") and sys.modules[m]]
        print("ctrctl modules:", loaded, "compiled:", fast.compiled)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ctrctl modules: [] compiled: True" in result.stdout
    from safetensors.torch import load_file

    theirs = load_file(str(tmp_path / "scores.safetensors"))
    assert torch.equal(theirs["scores"], quantized.model(dense, ids, lengths))
    torch.testing.assert_close(theirs["compiled"], theirs["scores"])


def test_predict_dataset_writes_scores_eval_reads(artifact: Path, trained: Trained,
                                                  quantized: QuantizedModel,
                                                  tmp_path: Path) -> None:
    out = tmp_path / "scores.parquet"
    result = predict_dataset(artifact, trained.dataset.path, "test", out, batch_size=256)
    table = pq.read_table(out)
    assert table.column_names == ["label", "score"] and result.rows == 600 == table.num_rows
    assert result.rows_per_s > 0
    from ctrctl.evaluation.sources import predictions_scores

    [batch] = list(predictions_scores(out))
    assert batch.scores.shape == (600,)
    with pytest.raises(OutputExistsError):
        predict_dataset(artifact, trained.dataset.path, "test", out)
    labels = np.concatenate([b.labels.numpy() for b in BatchLoader.for_scoring(
        trained.dataset.path, "test", 256, num_workers=0).epoch(0)])
    assert np.array_equal(table.column("label").to_numpy(), labels.astype(np.int8))


def test_predict_refuses_a_dataset_with_other_transforms(artifact: Path, trained: Trained,
                                                         tmp_path: Path) -> None:
    other = Path(shutil.copytree(trained.dataset.path, tmp_path / "other"))
    data = json.loads((other / "manifest.json").read_text())
    data["sparse"][2]["num_embeddings"] = 61
    data["sparse"][2]["hash_size"] = 61
    (other / "manifest.json").write_text(json.dumps(data))
    DatasetManifest.load(other)
    with pytest.raises(DatasetError, match="feature 'C3'.*61 rows"):
        predict_dataset(artifact, other, "test", tmp_path / "s.parquet")


def test_dense_weights_are_loaded_into_aligned_memory(artifact: Path) -> None:
    """safetensors hands out tensors at any offset of its buffer (here 12 and 56 bytes past a
    64-byte line), and MKL's GEMM sums in an order that follows alignment: the loaded
    program scored 1 ulp apart from the model it was exported from. The loader copies the
    floating-point state into torch's own (64-byte aligned) memory."""
    module = standalone.load(str(artifact)).module
    floats = [t for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]
    assert floats and all(t.data_ptr() % 64 == 0 for t in floats)


def test_an_overwrite_that_fails_keeps_the_old_artifact(artifact: Path, quantized: QuantizedModel,
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The artifact is staged under io's temp name and published by io.staged_folder: the
    old one stays until the new one is verified, and a killed export's folder is removed by
    the next write beside it."""
    out = _copy(artifact, tmp_path)
    before = tree_sha256(out)
    killed = temp_path(out, pid=2**22 + 1)  # no such process: left by a killed export
    killed.mkdir()
    (killed / "program.pt2").write_bytes(b"partial")

    def refuse(folder: str, verify_key: object = None) -> None:
        raise standalone.ArtifactError(f"{folder}: refused")

    monkeypatch.setattr(standalone, "verify", refuse)
    with pytest.raises(standalone.ArtifactError):
        write_artifact(quantized, out, overwrite=True)
    assert tree_sha256(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]


def test_the_checkpoint_hash_is_the_one_folder_hash(artifact: Path,
                                                    quantized: QuantizedModel) -> None:
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert quantized.checkpoint is not None
    assert manifest["hashes"]["checkpoint"] == tree_sha256(quantized.checkpoint)
