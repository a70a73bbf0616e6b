"""The server's parts without a server: batch merging, the canary split, the request log."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch

from ctrctl.inference.export import load_artifact
from ctrctl.serving import model_api
from ctrctl.serving.batcher import encode_with_context, merge_inputs
from ctrctl.serving.metrics import Metrics
from ctrctl.serving.models import canary_bucket
from ctrctl.serving.request_log import RequestLog

from .conftest import Exported


def _columns(records: list[dict[str, str]], names: list[str]) -> dict[str, list[str | None]]:
    return {n: [r.get(n) for r in records] for n in names}


def test_merged_requests_score_as_one_batch_of_their_rows(exported: Exported) -> None:
    model = load_artifact(exported.export)
    names = model_api.input_columns(model)
    records = exported.records(30)
    parts = [model_api.encode_columns(model, _columns(chunk, names), len(chunk))
             for chunk in (records[:4], records[4:5], records[5:30])]
    merged = merge_inputs(parts, len(model.contract["sparse"]))
    whole = model_api.encode_columns(model, _columns(records, names), 30)
    for got, want in zip(merged, whole, strict=True):
        assert torch.equal(got, want)
    assert model_api.score_columns(model, _columns(records, names), 30).shape == (30,)


def test_a_context_encoded_once_gives_the_merged_rows_inputs(exported: Exported) -> None:
    model = load_artifact(exported.export)
    names = model_api.input_columns(model)
    records = exported.records(12)
    shared = {"I2", "I7", "C1", "C4", "C9", "C20"}
    context = {k: v for k, v in records[0].items() if k in shared}
    candidates = [{k: v for k, v in r.items() if k not in shared} for r in records]
    merged = [{**c, **context} for c in candidates]
    got = encode_with_context(model, _columns(candidates, names), 12, context)
    want = model_api.encode_columns(model, _columns(merged, names), 12)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert torch.equal(model.score(*got), model.score(*want))  # bitwise


def test_a_bad_value_is_located_by_feature_and_row(exported: Exported) -> None:
    model = load_artifact(exported.export)
    columns = {"I1": ["1", None, "2"], "I3": [None, None, "many"]}
    try:
        model_api.encode_columns(model, columns, 3)
    except model_api.InputError as exc:
        assert (exc.feature, exc.row) == ("I3", 2)  # type: ignore[attr-defined]
        assert exc.expected in ("an integer", "a number")  # type: ignore[attr-defined]
    else:
        raise AssertionError("no InputError")


def test_the_canary_split_is_deterministic_and_near_its_share() -> None:
    ids = [f"request-{i}" for i in range(4000)]
    buckets = [canary_bucket(i) for i in ids]
    assert buckets == [canary_bucket(i) for i in ids]
    share = sum(b < 10.0 for b in buckets) / len(buckets)
    assert 0.08 < share < 0.12


def test_the_request_log_writes_rows_and_counts_what_it_drops(tmp_path: Path) -> None:
    metrics = Metrics()
    log = RequestLog(tmp_path / "log", ["I1", "C1"], metrics, rotate_rows=3)
    log.append("a", "1", {"I1": [1, None], "C1": ["x", "y"]}, [0.25, 0.5])
    log.append("b", "2", {"C1": ["z"]}, [0.75])
    log.close()
    table = pq.read_table(tmp_path / "log")
    assert table.column("request_id").to_pylist() == ["a", "a", "b"]
    assert table.column("I1").to_pylist() == ["1", None, None]
    assert table.column("score").to_pylist() == [0.25, 0.5, 0.75]
    assert log.dropped == 0 and log.written == 3

    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder should be")
    broken = RequestLog(blocked, ["I1"], metrics)
    broken.append("c", "1", {"I1": ["1"]}, [0.5])  # never raises
    broken.close()
    assert broken.dropped == 1
    assert metrics.log_dropped._value.get() == 1


def test_verify_key_refuses_an_unsigned_model_and_serves_a_signed_one(
        exported: Exported, tmp_path: Path) -> None:
    import shutil

    import pytest

    from ctrctl.inference import standalone
    from ctrctl.serving import ServeConfig
    from ctrctl.serving.server import check_models

    key = tmp_path / "serving.key"
    key.write_bytes(b"k" * 32)
    folder = tmp_path / "export"
    shutil.copytree(exported.export, folder)
    config = ServeConfig(model=str(folder), verify_key=str(key))
    with pytest.raises(standalone.ArtifactError, match="manifest.sig"):
        check_models(config)
    standalone.sign(str(folder), standalone.read_key(str(key)))
    assert "primary" in check_models(config)[0]
