"""Nothing runs from a serving artifact's folder: the probes of a crafted program archive,
unlisted or traversing files, FIFOs, malformed manifests, and the optional signature."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctrctl.errors import ConfigError
from ctrctl.inference import standalone
from ctrctl.inference.export import load_artifact, write_artifact
from ctrctl.inference.predictor import predict_dataset
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint

from .conftest import Trained

KEY = b"k" * 32


@pytest.fixture(scope="module")
def artifact(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    quantized = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", num_shards=1))
    umask = os.umask(0o022)
    try:
        return write_artifact(quantized, tmp_path_factory.mktemp("export") / "export",
                              dataset=trained.dataset.path)
    finally:
        os.umask(umask)


@pytest.fixture()
def copy(artifact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifact, tmp_path / "copy", symlinks=True))


def _edit_manifest(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _relist(folder: Path, relative: str) -> None:
    """Write ``relative``'s true size and sha256 into the manifest (as an attacker can)."""
    data = (folder / relative).read_bytes()

    def edit(manifest: dict[str, Any]) -> None:
        manifest["files"][relative] = {"sha256": hashlib.sha256(data).hexdigest(),
                                       "bytes": len(data)}
    _edit_manifest(folder, edit)


class _Payload:
    """Unpickling this writes a marker file: the proof that a pickle ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('payload ran')",))


def _pickled_weight_archive(program: Path, marker: Path, payload: str) -> None:
    """N45: one weight in the weights config marked ``use_pickle`` with a pickle payload."""
    source = zipfile.ZipFile(program)
    entries = {info.filename: source.read(info) for info in source.infolist()}
    source.close()
    config_name = next(n for n in entries if n.endswith("model_weights_config.json"))
    config = json.loads(entries[config_name])
    first = next(iter(config["config"]))
    config["config"][first] = {**config["config"][first], "path_name": payload,
                               "use_pickle": True}
    entries[config_name] = json.dumps(config).encode()
    entries[config_name.replace("model_weights_config.json", payload)] = pickle.dumps(
        _Payload(marker))
    with zipfile.ZipFile(program, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


@pytest.mark.parametrize(("payload", "refusal"), [("weight_evil", "unexpected entry"),
                                                  ("weight_99", "stored as a pickle")])
def test_a_pickled_weight_in_the_program_is_refused_before_torch_reads_it(
        copy: Path, tmp_path: Path, payload: str, refusal: str) -> None:
    marker = tmp_path / "PWNED_pt2"
    _pickled_weight_archive(copy / "program.pt2", marker, payload)
    _relist(copy, "program.pt2")
    with pytest.raises(standalone.ArtifactError, match=refusal):
        load_artifact(copy)
    assert not marker.exists()


def test_a_plain_pickle_as_the_program_is_one_clear_error(copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED_plain"
    (copy / "program.pt2").write_bytes(pickle.dumps(_Payload(marker)))
    _relist(copy, "program.pt2")
    with pytest.raises(standalone.ArtifactError, match="not a torch.export program"):
        load_artifact(copy)
    assert not marker.exists()


def test_a_program_calling_a_python_function_is_refused(copy: Path) -> None:
    program = copy / "program.pt2"
    with zipfile.ZipFile(program) as source:
        entries = {i.filename: source.read(i) for i in source.infolist()}
    name = next(n for n in entries if n.endswith("models/model.json"))
    entries[name] = entries[name].replace(b'"torch.ops.aten.sigmoid.default"',
                                          b'"torch.os.system"')
    with zipfile.ZipFile(program, "w") as archive:
        for entry, data in entries.items():
            archive.writestr(entry, data)
    _relist(copy, "program.pt2")
    with pytest.raises(standalone.ArtifactError, match="torch.os.system"):
        load_artifact(copy)


def test_an_unlisted_file_is_refused(copy: Path) -> None:
    (copy / "fbgemm_gpu.py").write_text("raise SystemExit('planted')\n")
    with pytest.raises(standalone.ArtifactError, match="fbgemm_gpu.py: not listed"):
        load_artifact(copy)


def test_the_pyfunc_imports_nothing_from_the_folder(copy: Path, tmp_path: Path) -> None:
    """N57: a module planted in the folder is neither imported nor accepted by the pyfunc."""
    marker = tmp_path / "PWNED_pyfunc"
    for module in ("fbgemm_gpu", "safetensors", "numpy"):
        (copy / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    code = Path(standalone.__file__).with_name("pyfunc_model.py")
    script = textwrap.dedent(f"""
        import importlib.util, types
        spec = importlib.util.spec_from_file_location("pyfunc_model", {str(code)!r})
        pyfunc_model = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pyfunc_model)
        context = types.SimpleNamespace(artifacts={{"export": {str(copy)!r}}}, model_config={{}})
        try:
            pyfunc_model.ServingArtifactModel().load_context(context)
        except Exception as exc:
            print("refused:", exc)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not marker.exists()
    assert "not listed in the manifest" in result.stdout
    assert not (copy / "__pycache__").exists()


@pytest.mark.parametrize("path", ["../../../../../../etc/hostname", "/etc/hostname",
                                  "tables/../../x", "./dense.safetensors"])
def test_a_listed_path_that_leaves_the_folder_is_refused(copy: Path, path: str) -> None:
    def edit(manifest: dict[str, Any]) -> None:
        manifest["files"][path] = {"sha256": "0" * 64, "bytes": 1}
    _edit_manifest(copy, edit)
    with pytest.raises(standalone.ArtifactError, match="not a plain relative path"):
        load_artifact(copy)


def test_a_symbolic_link_out_of_the_folder_is_refused(copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copyfile(copy / "dense.safetensors", outside)  # identical bytes
    (copy / "dense.safetensors").unlink()
    (copy / "dense.safetensors").symlink_to(outside)
    with pytest.raises(standalone.ArtifactError, match="leaves the artifact folder"):
        load_artifact(copy)


def test_a_vocabulary_path_must_be_a_listed_file(copy: Path) -> None:
    def edit(manifest: dict[str, Any]) -> None:
        feature = manifest["input"]["sparse"][0]
        feature["mode"], feature["vocabulary"] = "vocab", "../../../../../../etc/passwd"
    _edit_manifest(copy, edit)
    with pytest.raises(standalone.ArtifactError, match="is not among the listed files"):
        load_artifact(copy)


@pytest.mark.parametrize("malformed", ["no bytes", "files a list", "entry a string"])
def test_a_malformed_manifest_entry_is_one_clear_error(copy: Path, malformed: str) -> None:
    def edit(manifest: dict[str, Any]) -> None:
        if malformed == "no bytes":
            del manifest["files"]["dense.safetensors"]["bytes"]
        elif malformed == "files a list":
            manifest["files"] = sorted(manifest["files"])
        else:
            manifest["files"]["dense.safetensors"] = "abc"
    _edit_manifest(copy, edit)
    with pytest.raises(standalone.ArtifactError, match="manifest.json: .*(sha256|'files')"):
        load_artifact(copy)


def test_a_fifo_in_place_of_a_file_is_refused_without_blocking(copy: Path) -> None:
    fifo = copy / "dense.safetensors"
    fifo.unlink()
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            load_artifact(copy)
        except BaseException as exc:  # noqa: BLE001  (handed to the test's thread)
            errors.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():  # unblock the reader before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("loading blocked on a FIFO")
    assert len(errors) == 1 and isinstance(errors[0], standalone.ArtifactError)
    assert "not a regular file" in str(errors[0])


def test_the_export_is_readable_by_another_user(artifact: Path) -> None:
    assert stat.S_IMODE(artifact.stat().st_mode) == 0o755
    for path in artifact.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path


def test_a_signed_artifact_loads_only_under_its_key(copy: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    with pytest.raises(standalone.ArtifactError, match="manifest.sig: missing"):
        load_artifact(copy, verify_key=key_file)
    standalone.sign(str(copy), str(key_file))
    assert load_artifact(copy, verify_key=key_file).contract["order"]
    assert load_artifact(copy).contract["order"]  # no key: signed or not, it loads
    with pytest.raises(standalone.ArtifactError, match="does not match"):
        load_artifact(copy, verify_key=b"o" * 32)
    _edit_manifest(copy, lambda manifest: manifest.update(created="later"))
    with pytest.raises(standalone.ArtifactError, match="does not match"):
        load_artifact(copy, verify_key=KEY)
    (tmp_path / "short").write_bytes(b"x")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        load_artifact(copy, verify_key=tmp_path / "short")


def test_quantize_signs_and_predict_verifies(trained: Trained, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    quantized = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", num_shards=1))
    out = write_artifact(quantized, tmp_path / "signed", sign_key=key_file)
    assert (out / standalone.SIGNATURE).is_file()
    result = predict_dataset(out, trained.dataset.path, "test", tmp_path / "s.parquet",
                             verify_key=key_file, num_workers=0)
    assert result.rows == 600  # the fixture's test split
    with pytest.raises(standalone.ArtifactError, match="does not match"):
        predict_dataset(out, trained.dataset.path, "test", tmp_path / "t.parquet",
                        verify_key=b"o" * 32, num_workers=0)


def test_the_commands_sign_and_verify(trained: Trained, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ctrctl.cli.app import main

    key_file, other = tmp_path / "key", tmp_path / "other"
    key_file.write_bytes(KEY)
    other.write_bytes(b"o" * 32)
    out = tmp_path / "export"
    assert main(["quantize", "--checkpoint", str(trained.run), "--out", str(out),
                 "--sign", str(key_file), "--no-track"]) == 0
    assert (out / standalone.SIGNATURE).is_file()
    predict = ["predict", "--model", str(out), "--dataset", str(trained.dataset.path),
               "--out", str(tmp_path / "scores.parquet")]
    assert main([*predict, "--verify", str(key_file)]) == 0
    capsys.readouterr()
    assert main([*predict, "--overwrite", "--verify", str(other)]) == 1
    captured = capsys.readouterr()
    message = " ".join((captured.out + captured.err).split())
    assert "manifest.sig: the signature does not match" in message
    assert "Traceback" not in message
