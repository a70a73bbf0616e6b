"""``ctrctl plan`` end to end: the real command, the plan.json it writes, errors, MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.data.manifest import DatasetManifest, DenseFeature, SparseFeature, SplitInfo
from ctrctl.distributed.planner.suites import CRITEO_1TB_ROWS
from ctrctl.distributed.types import ShardingPlan


def _tables_yaml(path: Path, rows: tuple[int, ...] = CRITEO_1TB_ROWS, dim: int = 128) -> Path:
    path.write_text(f"embedding_dim: {dim}\nnum_embeddings_per_feature: {list(rows)}\n")
    return path


def _dataset(folder: Path) -> Path:
    manifest = DatasetManifest(
        label="label", dense=(DenseFeature("I1"),),
        sparse=(SparseFeature("C1", "hash", 100_000, mean_length=1.0),
                SparseFeature("C2", "vocab", 500, mean_length=3.5, multi_hot=True),
                SparseFeature("C3", "hash", 20_000, mean_length=1.0)),
        splits={"train": SplitInfo(rows=1000, label_rate=0.25)})
    manifest.save(folder)
    return folder


def test_plan_from_tables_writes_a_valid_plan(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", "--tables", str(_tables_yaml(tmp_path / "t.yaml")), "--world-size",
                 "8", "--device", "h100", "--out", str(out), "--no-track", "--json"])
    assert code == 0
    plan = ShardingPlan.load(out)
    plan.validate({f"t{i}": (n, 128) for i, n in enumerate(CRITEO_1TB_ROWS)})
    summary = json.loads(capsys.readouterr().out)
    assert summary["world_size"] == 8
    assert summary["estimated_step_seconds"] == pytest.approx(
        plan.metadata["estimated_step_seconds"])
    assert plan.topology["hbm_bytes"] == 80 * 1024**3


def test_plan_from_dataset_uses_pooling_and_forced_type(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", "--dataset", str(_dataset(tmp_path / "ds")), "--world-size", "2",
                 "--device", "cpu", "--embedding-dim", "64", "--sharding-type", "row_wise",
                 "--batch-size", "256", "--out", str(out), "--no-track"])
    assert code == 0
    plan = ShardingPlan.load(out)
    plan.validate({"C1": (100_000, 64), "C2": (500, 64), "C3": (20_000, 64)})
    assert {ps.sharding_type for ps in plan.tables.values()} == {"row_wise"}
    # C2 pools 3.5 ids per sample: it costs more to look up than C3
    assert plan.tables["C2"].cost["fwd_compute"] > plan.tables["C3"].cost["fwd_compute"]


def test_world_size_auto_finds_the_smallest(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", "--tables", str(_tables_yaml(tmp_path / "t.yaml")), "--world-size",
                 "auto", "--device", "a100-40", "--ddr-gb", "1", "--out", str(out),
                 "--no-track", "--json"])
    assert code == 0
    plan = ShardingPlan.load(out)
    # 5 x 40M x 128 fp32 tables (19 GiB each) need more than one 40 GiB GPU when host
    # memory cannot hold them either
    assert plan.world_size > 1
    assert "what more ranks buy" in capsys.readouterr().err


def test_no_fit_is_one_clean_line(tmp_path: Path, capsys) -> None:
    tables = tmp_path / "t.yaml"
    tables.write_text("tables:\n  - {name: huge, num_embeddings: 400000000, embedding_dim: 256,"
                      " compute_kernels: [fused]}\n")
    code = main(["plan", "--tables", str(tables), "--world-size", "2", "--device",
                 "a100-40", "--out", str(tmp_path / "plan.json"), "--no-track"])
    err = capsys.readouterr().err
    assert code == 1
    assert "error:" in err and "'huge'" in err and "Traceback" not in err
    assert not (tmp_path / "plan.json").exists()


def test_refuses_to_overwrite_and_bad_inputs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    out.write_text("{}")
    tables = str(_tables_yaml(tmp_path / "t.yaml", rows=(1000, 2000), dim=16))
    assert main(["plan", "--tables", tables, "--out", str(out), "--no-track"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert main(["plan", "--out", str(tmp_path / "p.json"), "--no-track"]) == 1
    assert "nothing to plan" in capsys.readouterr().err
    assert main(["plan", "--tables", tables, "--sharding-type", "diagonal", "--no-track"]) == 1
    assert "unknown sharding type" in capsys.readouterr().err


def test_tracks_plan_in_mlflow(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "plan.json"
    tables = str(_tables_yaml(tmp_path / "t.yaml", rows=(1000, 2000, 300000), dim=32))
    assert main(["plan", "--tables", tables, "--world-size", "2", "--device", "cpu",
                 "--out", str(out), "--tracking-uri", uri, "--experiment", "plan-test"]) == 0
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("plan-test").experiment_id])[0]
    assert run.data.metrics["estimated_step_seconds"] > 0
    assert run.data.params["device"] == "cpu"
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"plan.json", "plan_summary.json"} <= names


def test_plan_uses_a_topology_file(tmp_path: Path) -> None:
    from ctrctl.distributed.planner import Topology

    topo_path = Topology.preset("cpu", 2, ddr_bytes=64 * 1024**3, collective_latency_s=0.5,
                                kernel_fwd_bw={"32": 1e9}, kernel_bwd_bw={"32": 5e8}
                                ).save(tmp_path / "topology.json")
    out = tmp_path / "plan.json"
    tables = str(_tables_yaml(tmp_path / "t.yaml", rows=(1000, 2000), dim=32))
    assert main(["plan", "--tables", tables, "--world-size", "2", "--topology",
                 str(topo_path), "--out", str(out), "--no-track"]) == 0
    plan = ShardingPlan.load(out)
    assert plan.topology["kernel_fwd_bw"] == {"32": 1e9}
    assert plan.metadata["collective_overhead_seconds"] >= 0.5  # the file's latency is used


def test_plan_from_a_pipeline_config(tmp_path: Path) -> None:
    config = tmp_path / "pipe.yaml"
    config.write_text("model: {embedding_dim: 8, dense_arch: [16, 8], interaction: dot}\n"
                      "training: {batch_size: 256}\n"
                      "embedding_optimizer: {kind: adagrad}\n"
                      "plan: {world_size: 2, device: cpu, sharding_types: [table_wise]}\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(config), "--dataset", str(_dataset(tmp_path / "ds")),
                 "--out", str(out), "--no-track"]) == 0
    plan = ShardingPlan.load(out)
    assert plan.world_size == 2
    plan.validate({"C1": (100_000, 8), "C2": (500, 8), "C3": (20_000, 8)})
    assert {ps.sharding_type for ps in plan.tables.values()} == {"table_wise"}
    assert plan.metadata["batch_size_per_rank"] == 128  # the global batch over 2 ranks
    # the dense MLPs' parameters, gradients, adagrad state and activations are reserved:
    # bottom 1->16->8 and top (8 + 6 dot products)->64->32->1 by the default over_arch
    params = (1 * 16 + 16) + (16 * 8 + 8) + (14 * 64 + 64) + (64 * 32 + 32) + (32 * 1 + 1)
    assert plan.topology["dense_bytes"] == 4 * (3 * params + 2 * 128 * (16 + 8 + 64 + 32 + 1
                                                                       + 14))
    # adagrad keeps one float per element: 100,000 x 8 weights + as much state, at least
    assert plan.tables["C1"].storage_bytes >= 2 * 100_000 * 8 * 4


def test_plan_config_constraints_apply_per_table(tmp_path: Path) -> None:
    config = tmp_path / "pipe.yaml"
    config.write_text("model: {embedding_dim: 8, dense_arch: [16, 8], interaction: dot}\n"
                      "training: {batch_size: 256}\n"
                      "plan:\n"
                      "  world_size: 2\n"
                      "  device: cpu\n"
                      "  constraints:\n"
                      "    C1: {sharding_types: [row_wise]}\n"
                      "    C3: {sharding_types: [table_wise], ranks: [1]}\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(config), "--dataset", str(_dataset(tmp_path / "ds")),
                 "--out", str(out), "--no-track"]) == 0
    plan = ShardingPlan.load(out)
    plan.validate({"C1": (100_000, 8), "C2": (500, 8), "C3": (20_000, 8)})
    assert plan.tables["C1"].sharding_type == "row_wise"
    assert plan.tables["C3"].sharding_type == "table_wise"
    assert plan.tables["C3"].ranks == [1]


def test_plan_config_constraints_on_a_tables_file(tmp_path: Path) -> None:
    config = tmp_path / "pipe.yaml"
    config.write_text("plan: {constraints: {t1: {sharding_types: [column_wise],"
                      " min_col_block: 16}}}\n")
    out = tmp_path / "plan.json"
    tables = str(_tables_yaml(tmp_path / "t.yaml", rows=(1000, 2000), dim=32))
    assert main(["plan", "--config", str(config), "--tables", tables, "--world-size", "2",
                 "--device", "cpu", "--out", str(out), "--no-track"]) == 0
    plan = ShardingPlan.load(out)
    assert plan.tables["t1"].sharding_type == "column_wise"
    assert all(s.cols >= 16 for s in plan.tables["t1"].shards)


def test_plan_config_constraints_naming_an_unknown_table(tmp_path: Path, capsys) -> None:
    config = tmp_path / "pipe.yaml"
    config.write_text("plan: {constraints: {C9: {ranks: [0]}}}\n")
    code = main(["plan", "--config", str(config), "--dataset", str(_dataset(tmp_path / "ds")),
                 "--out", str(tmp_path / "plan.json"), "--no-track"])
    err = capsys.readouterr().err
    assert code == 1
    assert "error:" in err and "'C9'" in err and "plan.constraints" in err
    assert "Traceback" not in err
    assert not (tmp_path / "plan.json").exists()


def test_cpu_estimates_from_preset_figures_say_so(tmp_path: Path, capsys) -> None:
    from ctrctl.distributed.planner import Topology

    tables = str(_tables_yaml(tmp_path / "t.yaml", rows=(1000, 2000), dim=32))
    assert main(["plan", "--tables", tables, "--world-size", "2", "--device", "cpu",
                 "--no-track", "--json"]) == 0
    printed = capsys.readouterr()
    assert "preset figures, not this machine's" in printed.err and "--calibrate" in printed.err
    assert json.loads(printed.out)["figures"] == "preset"
    measured = Topology.preset("cpu", 2, calibrated={"host": "here", "seconds": 1.0})
    topo_path = measured.save(tmp_path / "topology.json")
    assert main(["plan", "--tables", tables, "--world-size", "2", "--topology",
                 str(topo_path), "--no-track", "--json"]) == 0
    printed = capsys.readouterr()
    assert "preset figures" not in printed.err
    assert json.loads(printed.out)["figures"] == "calibrated"
