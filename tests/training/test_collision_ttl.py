"""``eviction: ttl`` through training: the schema's time column flows from preprocess through
the loader and the train pipeline into the remapper, which evicts by the data's day."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.data.manifest import TIME_COLUMN
from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema
from ctrctl.data.synthetic_days import days_schema, synthesize_days
from ctrctl.distributed.pipeline import make_pipeline
from ctrctl.errors import DatasetError
from ctrctl.models.build import dlrm_from_manifest
from ctrctl.modules.collisions import CollisionRemapper
from tests.modules.test_collisions import Reference

TTL = {"collision": {"kind": "zch", "capacity": 48, "eviction": "ttl", "ttl_days": 1}}


@pytest.fixture(scope="module")
def ttl_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ttl")
    logs = synthesize_days(root / "logs", days=5, rows_per_day=400, new_ids_per_day=150,
                           initial_ids=200, popularity_drift=1.0, seed=3)
    schema = Schema.from_dict(days_schema(TTL, {"hash_size": 64}))
    inputs = [f"train={logs.files[d]}" for d in (1, 2, 3, 4)] + [f"test={logs.files[5]}"]
    preprocess(schema, inputs, root / "ds", val_fraction=0.0)
    return root / "ds"


def loader(dataset: Path) -> BatchLoader:
    return BatchLoader(dataset, "train", 200, shuffle=False, num_workers=0)


def test_preprocess_writes_each_rows_day_and_the_loader_carries_it(ttl_dataset: Path) -> None:
    part = sorted((ttl_dataset / "train").glob("*.parquet"))[0]
    assert pq.read_table(part, columns=[TIME_COLUMN])[TIME_COLUMN].to_pylist()[:3] == [1.0] * 3
    days = torch.cat([b.time for b in loader(ttl_dataset) if b.time is not None])
    assert days.dtype == torch.float64 and days.numel() == 1600
    assert days.tolist() == sorted(days.tolist()) and set(days.tolist()) == {1.0, 2.0, 3.0, 4.0}


def test_ttl_table_trains_and_evicts_by_the_datas_day(ttl_dataset: Path) -> None:
    manifest = BatchLoader(ttl_dataset, "train", 200, num_workers=0).manifest
    model = dlrm_from_manifest(manifest, 8, [], [8, 1], seed=0)
    assert model.collisions is not None
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    pipeline = make_pipeline("auto", model, optimizer, torch.device("cpu"))
    items = iter(enumerate(loader(ttl_dataset)))
    while True:
        try:
            pipeline.progress(items)
        except StopIteration:
            break
    remapper = model.collisions.remappers["user"].shards["0"]  # one shard: the whole table
    assert isinstance(remapper, CollisionRemapper)
    # The reference fed the same steps, each at its batch's (latest) day.
    reference = Reference(remapper.config)
    for batch in loader(ttl_dataset):
        sparse = batch.sparse.to_dict()["user"]
        assert batch.time is not None
        reference.remap(sparse.values().tolist(), float(batch.time.max()))
    owned = {int(s): int(remapper.slot_keys[s]) for s in remapper.occupied.nonzero().flatten()}
    assert owned == reference.owner
    stats = remapper.stats()
    assert (stats["admissions"], stats["evictions"]) == (reference.admissions,
                                                         reference.evictions)
    assert reference.evictions > 0  # rows unused for a day were freed
    # Every owner was looked up on day 3 or 4: a day-1 or day-2 owner would have expired.
    assert float(remapper.last_time[remapper.occupied].min()) >= 3.0


def test_a_dataset_without_the_time_column_is_one_clear_error(ttl_dataset: Path,
                                                              tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(ttl_dataset, copy)
    for part in (copy / "train").glob("*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.drop([TIME_COLUMN]), part)
    with pytest.raises(DatasetError, match="__time") as info:
        loader(copy)
    assert "data time" in (info.value.hint or "")


def test_a_timestamp_time_column_becomes_days_and_a_bad_time_a_bad_row(tmp_path: Path) -> None:
    """``derive.format``: the timestamp read as days since 1970-01-01 UTC; a row whose time
    is missing or unreadable is a bad row (a ttl table could not place it in time)."""
    rows = ["1,14102100,aa", "0,14102112,bb", "1,,cc", "0,notatime,dd", "1,14102200,aa"]
    raw = tmp_path / "logs.csv"
    raw.write_text("click,hour,user\n" + "\n".join(rows) + "\n")
    schema = Schema.from_dict({
        "name": "stamped", "format": "csv", "header": True, "label": "click",
        "time_column": "hour",
        "columns": [{"name": "click", "role": "label"},
                    {"name": "hour", "role": "ignore",
                     "derive": {"format": "%y%m%d%H", "features": ["hour_of_day"]}},
                    {"name": "user", "role": "sparse", "type": "string", "collision": {
                        "kind": "zch", "capacity": 8, "eviction": "ttl", "ttl_days": 1}}]})
    manifest = preprocess(schema, [f"train={raw}"], tmp_path / "ds", val_fraction=0.0,
                          on_bad_rows="skip")
    times = pq.read_table(tmp_path / "ds" / manifest.split("train").files[0],
                          columns=[TIME_COLUMN])[TIME_COLUMN].to_pylist()
    day = 16364.0  # 2014-10-21 is day 16,364 after 1970-01-01
    assert times == [day, day + 0.5, day + 1.0]
    assert manifest.bad_rows.get("bad_sparse") == 2
