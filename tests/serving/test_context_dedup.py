"""``/v1/rank``'s context looked up once: the artifact's sparse and dense stages (format 2),
the context's pooled vectors broadcast, bitwise the scores of the merged rows; and a
format-1 artifact (one program) still loads and ranks through the merged inputs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from ctrctl.inference import standalone
from ctrctl.inference.export import STAGE_FILES, load_artifact
from ctrctl.serving import model_api
from ctrctl.serving.batcher import encode_with_context, pool_with_context

from .conftest import Exported

SHARED = {"I2", "I7", "C1", "C4", "C9", "C20"}


def _columns(records: list[dict[str, Any]], names: list[str]) -> dict[str, list[Any]]:
    return {n: [r.get(n) for r in records] for n in names if any(n in r for r in records)}


def _rank_request(exported: Exported, n: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    records = exported.records(n)
    context = {k: v for k, v in records[0].items() if k in SHARED}
    return [{k: v for k, v in r.items() if k not in SHARED} for r in records], context


def test_the_two_stages_score_as_the_whole_program_bitwise(exported: Exported) -> None:
    model = load_artifact(exported.export)
    assert set(model.stages) == {"sparse", "dense"}
    names = model_api.input_columns(model)
    records = exported.records(40)
    dense, ids, lengths = model_api.encode_columns(model, _columns(records, names), 40)
    pooled = model.pool(ids, lengths)
    assert pooled.shape == (40, len(model.contract["sparse"]), pooled.size(2))
    assert torch.equal(model.score_pooled(dense, pooled), model.score(dense, ids, lengths))


def test_a_context_pooled_once_scores_as_the_merged_rows_bitwise(exported: Exported) -> None:
    model = load_artifact(exported.export)
    names = model_api.input_columns(model)
    candidates, context = _rank_request(exported, 25)
    merged = [{**c, **context} for c in candidates]
    result = pool_with_context(model, _columns(candidates, names), 25, context)
    assert result is not None
    dense, pooled, (_, own_ids, own_lengths) = result
    want = model.score(*model_api.encode_columns(model, _columns(merged, names), 25))
    assert torch.equal(model.score_pooled(dense, pooled), want)  # bitwise
    # the candidates look up none of the context's features: their bags are empty
    sparse = [f["name"] for f in model.contract["sparse"]]
    per_feature = own_lengths.view(len(sparse), 25).sum(1).tolist()
    assert all(per_feature[f] == 0 for f, name in enumerate(sparse) if name in context)
    assert own_ids.numel() == sum(per_feature)


def test_a_format_1_artifact_loads_and_ranks_through_merged_inputs(exported: Exported,
                                                                     tmp_path: Path) -> None:
    old = tmp_path / "format1"
    shutil.copytree(exported.export, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format_version"] = 1
    del manifest["stages"]
    for relative in STAGE_FILES.values():
        del manifest["files"][relative]
        (old / relative).unlink()
    (old / "manifest.json").write_text(json.dumps(manifest))
    model = load_artifact(old)
    assert model.stages == {}
    names = model_api.input_columns(model)
    candidates, context = _rank_request(exported, 10)
    columns = _columns(candidates, names)
    assert pool_with_context(model, columns, 10, context) is None
    merged = [{**c, **context} for c in candidates]
    assert torch.equal(model.score(*encode_with_context(model, columns, 10, context)),
                       model.score(*model_api.encode_columns(model, _columns(merged, names),
                                                             10)))


def test_an_unknown_format_version_is_refused_with_what_to_do(exported: Exported,
                                                              tmp_path: Path) -> None:
    newer = tmp_path / "format9"
    shutil.copytree(exported.export, newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    manifest["format_version"] = 9
    (newer / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(standalone.ArtifactError, match="format version 9 is not supported"):
        load_artifact(newer)


def test_a_stage_file_not_in_the_manifest_is_refused(exported: Exported,
                                                     tmp_path: Path) -> None:
    bad = tmp_path / "unlisted"
    shutil.copytree(exported.export, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["stages"]["sparse"]["file"] = "elsewhere.pt2"
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(standalone.ArtifactError, match="not among the manifest's files"):
        load_artifact(bad)
