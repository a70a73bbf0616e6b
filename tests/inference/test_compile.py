"""``serving.load(..., compile=True)``: the program compiled by TorchInductor scores as the
program does, and where it cannot compile, the program runs as exported with a warning.

(The FP32-dense program compiled in a process without ctrctl: ``test_export.py``.)"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.inference import standalone
from ctrctl.inference.export import load_artifact, write_artifact
from ctrctl.inference.predictor import batch_inputs
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.inference.sharded_dlrm import fused_linear_available

from .conftest import Trained


@pytest.fixture(scope="module")
def bf16_artifact(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    quantized = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", num_shards=2,
                                                                dense_dtype="bf16"))
    return write_artifact(quantized, tmp_path_factory.mktemp("bf16") / "export",
                          dataset=trained.dataset.path)


def _requests(trained: Trained, order: list[str]) -> list[tuple[torch.Tensor, ...]]:
    """Batches of 128, 1 and 37 rows of the test split (batch 1 has its own graph)."""
    loader = BatchLoader.for_scoring(trained.dataset.path, "test", 128, num_workers=0)
    dense, ids, lengths = batch_inputs(next(iter(loader.epoch(0))), order)
    out = [(dense, ids, lengths)]
    per = lengths.view(len(order), -1)
    for rows in (1, 37):  # the first rows of every feature
        starts = torch.cat([per.new_zeros(1), per.sum(1).cumsum(0)[:-1]])
        take = [ids[s:s + int(per[f, :rows].sum())] for f, s in enumerate(starts.tolist())]
        out.append((dense[:rows], torch.cat(take), per[:, :rows].reshape(-1)))
    return out


@pytest.mark.skipif(not fused_linear_available(), reason="no oneDNN bfloat16 on this CPU")
def test_compiled_bf16_program_scores_as_exported(bf16_artifact: Path, trained: Trained) -> None:
    exported = load_artifact(bf16_artifact)
    assert not exported.compiled
    targets = {str(n.target) for n in exported.module.graph.nodes}
    assert any("_linear_pointwise" in t for t in targets)  # the fused layers it un-fuses
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback: it compiles
        fast = load_artifact(bf16_artifact, compile=True)
    assert fast.compiled
    for request in _requests(trained, fast.contract["order"]):  # bf16 casts rounded alike
        assert torch.equal(fast.score(*request), exported.score(*request))


def test_a_program_that_cannot_compile_runs_as_exported(bf16_artifact: Path, trained: Trained,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compiler(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no working C++ compiler found\nmore detail")

    monkeypatch.setattr(standalone, "compile_program", no_compiler)
    with pytest.warns(RuntimeWarning, match=r"could not be compiled \(RuntimeError: no "
                                            r"working C\+\+ compiler found\); it runs as "):
        serving = load_artifact(bf16_artifact, compile=True)
    assert not serving.compiled
    request = _requests(trained, serving.contract["order"])[0]
    assert torch.equal(serving.score(*request), load_artifact(bf16_artifact).score(*request))


def test_pyfunc_model_config_turns_compiling_on(bf16_artifact: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from ctrctl.inference import pyfunc_model
    from ctrctl.inference.pyfunc_model import ServingArtifactModel

    calls: list[bool] = []
    monkeypatch.setattr(standalone, "load",
                        lambda folder, compile=False, verify_key=None:
                        calls.append(compile) or "model")
    # The model loads the artifact's serving.py by its path: hand it this loader instead.
    monkeypatch.setattr(pyfunc_model, "load_loader", lambda folder: standalone)

    for config in (None, {}, {"compile": True}):
        model = ServingArtifactModel()
        model.load_context(SimpleNamespace(artifacts={"export": str(bf16_artifact)},
                                           model_config=config))
    assert calls == [False, False, True]
