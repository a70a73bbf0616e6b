"""A registered recommend bundle served by alias: the alias moved to another bundle version
is hot-reloaded (both stages, no request failing), and a version that cannot be loaded (a
plain ranker, a changed file) leaves the old one serving and is counted."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ctrctl.inference.bundle import load_bundle, make_bundle
from ctrctl.inference.export import quantize_to_artifact
from ctrctl.inference.quantize import QuantizeConfig
from tests.bundle_helpers import build_bundle
from tests.serving.conftest import Server, start_server

#: Trains a two-tower model and a DLRM, bundles them twice and serves them (about 60 s).
pytestmark = pytest.mark.slow

QUERY = {"query": {"user": "17"}, "k": 5, "candidates": 50}


@dataclass(frozen=True)
class Registry:
    uri: str
    bundles: dict[str, Path]  # registered version -> its bundle folder

    def move(self, alias: str, version: str) -> None:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=self.uri).set_registered_model_alias("rec", alias, version)

    def expected(self, version: str) -> dict[str, Any]:
        """What /v1/recommend answers for QUERY with the bundle of ``version``."""
        answer = load_bundle(self.bundles[version]).recommend(
            QUERY["query"], k=QUERY["k"], candidates=QUERY["candidates"])
        return answer.to_dict()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """Version 1: a bundle (INT8 ranker); 2: the same retrieval with an INT2 ranker (other
    scores); 3: a plain ranker (no bundle tag); 4: a bundle whose ranker manifest was
    changed after it was made."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from ctrctl.tracking import make_tracker

    root = tmp_path_factory.mktemp("bundle-reload")
    first = build_bundle(root)
    quantize_to_artifact(root / "ctr", root / "ranker2", QuantizeConfig(dtype="int2"),
                         log_model=False)
    second = root / "bundle2"
    make_bundle(root / "retrieval", root / "ranker2", second)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment(
        "bundles", artifact_location=(root / "artifacts").as_uri())
    tracker = make_tracker(tracking_uri=uri, experiment="bundles")
    for folder in (first, second):
        make_bundle(folder / "retrieval", folder / "ranker", root / f"reg-{folder.name}",
                    tracker=tracker, register="rec")
    client = MlflowClient(tracking_uri=uri)
    # 3: the ranker alone, registered under the bundle's name without the bundle's tag
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_artifacts(str(root / "ranker"), "model")
    client.create_model_version("rec", f"runs:/{run.info.run_id}/model", run.info.run_id)
    # 4: a bundle with one byte of its ranker's manifest changed after it was made
    bad = root / "bad"
    shutil.copytree(second, bad)
    manifest = bad / "ranker" / "manifest.json"
    manifest.write_text(manifest.read_text() + " ")
    with mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_artifacts(str(bad), "model")
    client.create_model_version("rec", f"runs:/{run.info.run_id}/model", run.info.run_id,
                                tags={"ctrctl.kind": "recommend_bundle"})
    registry = Registry(uri, {"1": first, "2": second})
    # the two versions' scores tell apart far beyond assert_answers' tolerance (1e-5): the
    # little ranker scores near its base rate, so INT8 and INT2 differ by 3e-4 to 9e-4
    assert registry.expected("1")["scores"] != pytest.approx(registry.expected("2")["scores"],
                                                             abs=1e-4)
    return registry


def serve(registry: Registry, alias: str, tmp_path: Path) -> Server:
    registry.move(alias, "1")
    return start_server(f"models:/rec@{alias}", "--tracking-uri", registry.uri, "--cache-dir",
                        str(tmp_path / "cache"), "--poll-s", "0.3",
                        "--max-rows-per-request", "100")


def assert_answers(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert body["items"] == expected["items"] and body["candidates"] == expected["candidates"]
    np.testing.assert_allclose(body["scores"], expected["scores"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(body["retrieval_scores"], expected["retrieval_scores"],
                               rtol=1e-5, atol=1e-6)


def recommend(server: Server) -> tuple[int, dict[str, Any], str | None]:
    """(status, body, X-Model-Version) of /v1/recommend for QUERY."""
    status, body, headers = server.post("/v1/recommend", QUERY)
    return status, body, {k.lower(): v for k, v in headers.items()}.get("x-model-version")


def wait_for(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def reload_failures(server: Server) -> float:
    _, text = server.get("/metrics")
    found = re.search(r'^ctrctl_reload_failures_total\{role="primary"\} (\S+)$', text, re.M)
    return float(found[1]) if found else 0.0


def test_alias_moved_to_another_bundle_swaps_both_stages_under_load(
        registry: Registry, tmp_path: Path) -> None:
    server = serve(registry, "live", tmp_path)
    seen: list[tuple[int, dict[str, Any], str]] = []
    failures: list[Any] = []
    stop = threading.Event()

    def load(worker: int) -> None:
        while not stop.is_set():
            status, body, version = recommend(server)
            if status != 200 or version is None:
                failures.append((status, body))
            else:
                seen.append((worker, body, version))

    threads = [threading.Thread(target=load, args=(w,)) for w in range(3)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: len(seen) >= 6)
        registry.move("live", "2")
        wait_for(lambda: any(v == "2" for _, _, v in seen[-3:]))
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join()
        assert not failures, failures[:3]
        expected = {v: registry.expected(v) for v in ("1", "2")}
        for worker in range(3):
            versions = [body["model"]["version"] for w, body, _ in seen if w == worker]
            switch = versions.index("2")
            assert switch > 0 and set(versions[:switch]) == {"1"}
            assert set(versions[switch:]) == {"2"}, versions
        for _, body, header in seen:  # one version's retrieval and ranker, the one named
            assert header == body["model"]["version"]
            assert body["model"]["name"] == "rec"
            assert_answers(body, expected[header])
        status, text = server.get("/v1/model")
        model = json.loads(text)["primary"]
        assert status == 200 and (model["name"], model["version"]) == ("rec", "2")
        assert model["bundle"] == json.loads((registry.bundles["2"] / "bundle.json").read_text())
        _, metrics = server.get("/metrics")
        assert 'endpoint="recommend",model_version="1",status="200"' in metrics
        assert 'endpoint="recommend",model_version="2",status="200"' in metrics
        assert 'ctrctl_model_info{model_version="2",role="primary"} 1.0' in metrics
        assert 'ctrctl_model_info{model_version="1",role="primary"} 0.0' in metrics
        assert reload_failures(server) == 0
    finally:
        stop.set()
        code, output = server.stop()
    assert code == 0, output
    assert "primary model swapped: version 1 -> 2" in output


def test_a_version_that_fails_to_load_leaves_the_old_bundle_serving(
        registry: Registry, tmp_path: Path) -> None:
    server = serve(registry, "trial", tmp_path)
    try:
        for bad in ("3", "4"):  # a plain ranker; a bundle with a changed manifest
            before = reload_failures(server)
            registry.move("trial", bad)
            wait_for(lambda before=before: reload_failures(server) >= before + 2)
            status, body, version = recommend(server)
            assert status == 200 and version == "1"
            assert_answers(body, registry.expected("1"))
        _, metrics = server.get("/metrics")
        assert 'ctrctl_model_info{model_version="1",role="primary"} 1.0' in metrics
        registry.move("trial", "2")  # a good version after bad ones is still taken
        wait_for(lambda: recommend(server)[2] == "2")
    finally:
        code, output = server.stop()
    assert code == 0, output
    warnings = [line for line in output.splitlines() if "could not be loaded" in line]
    assert len(warnings) == 2, output  # one line per failed version, not one per try
    assert "version 3 of models:/rec@trial" in warnings[0]
    assert "not a recommendation bundle" in warnings[0]
    assert "version 4 of models:/rec@trial" in warnings[1]
    assert "ranker/manifest.json does not match" in warnings[1]
