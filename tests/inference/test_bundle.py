"""The recommendation bundle: its scores are the separate models' calls; changes refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ctrctl.errors import CheckpointError, ConfigError
from ctrctl.inference.bundle import load_bundle, make_bundle
from ctrctl.inference.export import load_artifact
from ctrctl.inference.retrieval import load_retrieval
from tests.bundle_helpers import build_bundle

#: Trains a two-tower model and a DLRM, exports both (about 30 s on a loaded core).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("bundle"))


def test_the_bundles_scores_equal_the_separate_models_calls(bundle: Path) -> None:
    root = bundle.parent
    loaded = load_bundle(bundle)
    answer = loaded.recommend({"user": "17"}, k=5, candidates=50)
    assert answer.candidates == 50 and len(answer.items) == 5
    # the separate exports, called by hand: the query tower and index, then the ranker
    retrieval = load_retrieval(root / "retrieval")
    cosines, items = retrieval.retrieve({"user": ["17"]}, 50)
    ranker = load_artifact(root / "ranker")
    scores = ranker.score_columns({"item": [str(i) for i in items[0]], "user": ["17"] * 50},
                                  50)
    best = np.argsort(-scores, kind="stable")[:5]
    assert answer.items.tolist() == items[0][best].tolist()
    np.testing.assert_allclose(answer.rank_scores, scores[best], rtol=0, atol=0)
    np.testing.assert_allclose(answer.retrieval_scores, cosines[0][best], rtol=0, atol=0)
    assert np.all(np.diff(answer.rank_scores) <= 0)
    info = json.loads((bundle / "bundle.json").read_text())
    assert info["item_feature"] == "item" and info["ranker_context_columns"] == ["user"]
    assert info["retrieval"]["checkpoint"] and info["ranker"]["checkpoint"]


def test_a_changed_file_in_either_export_is_refused(bundle: Path, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    manifest = copy / "ranker" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"', '"', 1) + " ")
    with pytest.raises(CheckpointError, match="ranker/manifest.json does not match"):
        load_bundle(copy)
    shutil.rmtree(copy)
    shutil.copytree(bundle, copy)
    (copy / "retrieval" / "tower.json").write_text("{}")
    with pytest.raises(CheckpointError, match="tower.json does not match its sha256"):
        load_bundle(copy)


def test_a_ranker_without_the_item_feature_is_refused(bundle: Path, tmp_path: Path) -> None:
    root = bundle.parent
    with pytest.raises(ConfigError, match="no input column 'movie'"):
        make_bundle(root / "retrieval", root / "ranker", tmp_path / "x", item_feature="movie")


def test_quantize_with_a_ranker_writes_a_bundle(bundle: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ctrctl.cli.app import app

    root = bundle.parent
    done = CliRunner().invoke(app, ["quantize", "--checkpoint", str(root / "tt"), "--index",
                                    str(root / "index"), "--ranker", str(root / "ranker"),
                                    "--out", str(tmp_path / "b"), "--no-track"])
    assert done.exit_code == 0, done.output
    answer = load_bundle(tmp_path / "b").recommend({"user": "3"}, k=3, candidates=20)
    assert len(answer.items) == 3
    done = CliRunner().invoke(app, ["quantize", "--checkpoint", str(root / "ctr"), "--ranker",
                                    str(root / "ranker"), "--out", str(tmp_path / "c"),
                                    "--no-track"])
    assert done.exit_code == 1 and "--index" in str(done.exception)


def test_a_registered_bundle_carries_both_models_lineage_and_loads(bundle: Path,
                                                                   tmp_path: Path) -> None:
    import mlflow
    from mlflow import MlflowClient

    from ctrctl.tracking import make_tracker

    root = bundle.parent
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    info = make_bundle(root / "retrieval", root / "ranker", tmp_path / "b",
                       tracker=make_tracker(tracking_uri=uri, experiment="b"), register="rec")
    assert info["model_uri"] == "models:/rec/1"
    version = MlflowClient(uri).get_model_version("rec", "1")
    assert version.tags["ctrctl.kind"] == "recommend_bundle"
    for stage in ("retrieval", "ranker"):
        assert version.tags[f"ctrctl.{stage}.checkpoint"] == info[stage]["checkpoint"]
        assert len(version.tags[f"ctrctl.{stage}.manifest_sha256"]) == 64
    mlflow.set_tracking_uri(uri)
    local = mlflow.artifacts.download_artifacts(f"runs:/{version.run_id}/model",
                                                dst_path=str(tmp_path / "dl"))
    assert len(load_bundle(local).recommend({"user": "5"}, k=2, candidates=10).items) == 2


def test_a_registered_bundle_is_resolved_for_serving(bundle: Path, tmp_path: Path) -> None:
    from ctrctl.inference.standalone import verify
    from ctrctl.serving.recommend import resolve_bundle
    from ctrctl.tracking import make_tracker

    root = bundle.parent
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    make_bundle(root / "retrieval", root / "ranker", tmp_path / "b",
                tracker=make_tracker(tracking_uri=uri, experiment="b"), register="rec")
    ranker, folder = resolve_bundle("models:/rec/1", uri, str(tmp_path / "cache"))
    assert folder is not None and Path(ranker) == Path(folder) / "ranker"
    verify(ranker)
    assert load_bundle(folder).info == json.loads((bundle / "bundle.json").read_text())
    assert resolve_bundle(str(bundle)) == (str(bundle / "ranker"), str(bundle))
    assert resolve_bundle(str(root / "ranker")) == (str(root / "ranker"), None)
