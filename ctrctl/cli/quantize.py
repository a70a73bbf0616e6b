"""``ctrctl quantize``: a trained checkpoint -> a quantized, sharded serving artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ctrctl.cli.common import (
    Experiment,
    NoTrack,
    OutDir,
    Overwrite,
    TrackingUri,
    console,
    locked,
    tracker_from,
)
from ctrctl.errors import ConfigError


def bf16_dense_note(dense_dtype: str) -> str | None:
    """What to say when bf16 dense layers are exported on a machine that would emulate them."""
    from ctrctl.compat import bf16_autocast_supported

    if dense_dtype != "bf16" or bf16_autocast_supported("cpu"):
        return None
    return ("note: this CPU has no AMX-BF16 or AVX512-BF16, so the bf16 dense layers are "
            "emulated here and score several times slower than fp32 (6x measured on an "
            "AVX2 CPU); the artifact runs at speed on CPUs with them and on GPUs. For "
            "serving here, --dense-dtype fp32.")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


def _render_placement(plan: Any) -> None:
    """The planner's explanation of the serving placement, in ``ctrctl plan``'s style."""
    placement = plan.extra.get("placement") or {}
    summary = placement.get("summary", {})
    limit = plan.device_memory_bytes
    shards = Table(title=f"serving placement: {plan.num_shards} shard(s) (estimated us per "
                         f"request of {plan.request_size} candidates, inference cost mode)")
    for name in ("shard", "device", "memory", "lookup", "comms", "total", "tables"):
        shards.add_column(name, justify="left" if name in ("device", "tables") else "right")
    for s, row in zip(plan.shards, placement.get("shards", [{}] * plan.num_shards),
                      strict=True):
        used = float(s["bytes"])
        memory = (f"{used / 2**20:,.2f}/{limit / 2**20:,.1f} MiB ({100 * used / limit:.0f}%)"
                  if limit else f"{used / 2**20:,.2f} MiB")
        shards.add_row(str(s["shard"]), s["device"], memory,
                       _us(row.get("fwd_compute", 0.0)), _us(row.get("fwd_comms", 0.0)),
                       _us(row.get("total", 0.0)), ", ".join(s["tables"]))
    console.print(shards)
    if not summary:
        return
    slow = ", ".join(f"{d['table']} ({_us(d['cost'])} us)"
                     for d in summary["top_tables_slowest_rank"])
    full = ", ".join(f"{d['table']} ({d['memory'] / 2**20:,.2f} MiB)"
                     for d in summary["top_tables_fullest_rank"])
    console.print(
        f"{plan.num_shards} shard(s) ({summary['device']}): estimated "
        f"{_us(summary['estimated_step_seconds'])} us per request (slowest shard "
        f"{summary['slowest_rank']}, collectives' latency "
        f"{_us(summary['collective_overhead_seconds'])} us), imbalance "
        f"{summary['imbalance']:.3f}, planned in {summary['planning_seconds']:.2f} s")
    console.print(f"slowest shard {summary['slowest_rank']}: {slow}")
    share = (f" ({100 * summary['fullest_rank_fraction']:.0f}% of memory)" if limit else "")
    console.print(f"fullest shard {summary['fullest_rank']}{share}: {full}")


def quantize_command(
    checkpoint: Annotated[Path, typer.Option(help="Training output or checkpoint folder.")],
    out: OutDir,
    dtype: Annotated[str, typer.Option(
        help="Table type: int8, int4, int2, fp16 or fp8.")] = "int8",
    per_table: Annotated[list[str] | None, typer.Option(
        "--per-table", help="NAME=DTYPE for one table (repeatable).",
        show_default=False)] = None,
    shards: Annotated[int, typer.Option(help="Serving shards (devices or hosts).")] = 1,
    device_memory_gb: Annotated[float | None, typer.Option(
        "--device-memory-gb", help="Table memory per shard, GiB.")] = None,
    dense_dtype: Annotated[str, typer.Option(
        "--dense-dtype", help="Dense layers: fp32, bf16 or int8 (int8: eager only).")] = "fp32",
    dataset: Annotated[Path | None, typer.Option(
        help="Training dataset (for vocabularies; default: the checkpoint's).")] = None,
    index: Annotated[Path | None, typer.Option(
        help="Two-tower checkpoints: the item index (ctrctl index) exported with the query "
             "tower, whose tables take --dtype; the export reports the top-100 overlap "
             "of the quantized tower with the FP32 one.")] = None,
    ranker: Annotated[Path | None, typer.Option(
        help="With --index: a ranker export (ctrctl quantize of a DLRM) bundled with the "
             "retrieval export into --out: one folder for `ctrctl serve` (POST "
             "/v1/recommend), hashed, with lineage to both training runs.")] = None,
    item_feature: Annotated[str | None, typer.Option(
        help="With --ranker: the ranker's column that takes the retrieved item id "
             "(default: the two-tower model's item id feature).")] = None,
    register_as: Annotated[str | None, typer.Option(
        help="With --ranker and tracking: register the bundle as a new version of this "
             "model name.")] = None,
    sign: Annotated[Path | None, typer.Option(
        "--sign", help="Key file (16+ random bytes): sign the manifest (HMAC-SHA256), so "
        "`predict --verify KEY` can require it.")] = None,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Quantize a checkpoint's tables, place them on serving shards, export the model.

    A two-tower checkpoint (model.kind: two_tower) takes --index: its query tower is
    exported with --dtype tables beside the item index, every file hashed; with --ranker,
    the two exports become one bundle that `ctrctl serve` answers POST /v1/recommend
    from."""
    from ctrctl.inference.export import quantize_to_artifact
    from ctrctl.inference.quantize import QuantizeConfig, parse_per_table

    config = QuantizeConfig(
        dtype=dtype.lower(), per_table=parse_per_table(per_table or []), num_shards=shards,
        device_memory_bytes=(int(device_memory_gb * 2**30) if device_memory_gb is not None
                             else None),
        dense_dtype=dense_dtype.lower())
    note = bf16_dense_note(config.dense_dtype)
    if note:
        console.print(note, style="yellow")
    tracker = tracker_from(no_track, tracking_uri, experiment)
    if index is not None:
        if ranker is not None:
            _bundle(checkpoint, index, ranker, out, config.dtype, dataset, overwrite, tracker,
                    item_feature, register_as)
        else:
            _export_retrieval(checkpoint, index, out, config.dtype, dataset, overwrite,
                              tracker)
        return
    if ranker is not None:
        raise ConfigError("--ranker bundles a two-tower export: it needs --index",
                          where="--ranker", hint="pass the two-tower checkpoint's --index")
    with locked(out, "quantize"):
        q = quantize_to_artifact(checkpoint, out, config, dataset=dataset, overwrite=overwrite,
                                 tracker=tracker, sign_key=sign)
    table = Table(title=f"quantize: {q.fp32_bytes / 2**20:,.2f} MiB -> "
                        f"{q.quantized_bytes / 2**20:,.2f} MiB "
                        f"({q.quantized_bytes / max(q.fp32_bytes, 1):.3f}x)")
    for column in ("table", "rows", "dim", "dtype", "fp32 bytes", "bytes", "ratio", "shard"):
        table.add_column(column, justify="left" if column in ("table", "dtype") else "right")
    for r in q.table_report:
        table.add_row(r["table"], f"{r['rows']:,}", str(r["dim"]), r["dtype"],
                      f"{r['fp32_bytes']:,}", f"{r['bytes']:,}",
                      f"{r['bytes'] / r['fp32_bytes']:.3f}", str(r["shard"]))
    console.print(table)
    _render_placement(q.plan)
    console.print(f"artifact: {out}", markup=False)


def _export_retrieval(checkpoint: Path, index: Path, out: Path, dtype: str,
                      dataset: Path | None, overwrite: bool, tracker: Any) -> None:
    from ctrctl.inference.retrieval import export_retrieval

    with locked(out, "quantize"):
        exported = export_retrieval(checkpoint, index, out, dtype=dtype, dataset=dataset,
                                    overwrite=overwrite, tracker=tracker,
                                    log_model=getattr(tracker, "enabled", False))
    m = exported.manifest
    table = Table(title=f"query tower: {exported.fp32_bytes:,} -> "
                        f"{exported.quantized_bytes:,} table bytes ({dtype}), "
                        f"{m.get('index_kind')} index of {m.get('items') or 0:,} items")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key in ("overlap@100", "cosine", "cost_queries"):
        if key in m:
            table.add_row(key, f"{m[key]:.4f}" if key != "cost_queries" else f"{m[key]:,.0f}")
    console.print(table)
    console.print(f"retrieval export: {out}", markup=False)


def _bundle(checkpoint: Path, index: Path, ranker: Path, out: Path, dtype: str,
            dataset: Path | None, overwrite: bool, tracker: Any, item_feature: str | None,
            register_as: str | None) -> None:
    import tempfile

    from ctrctl.inference.bundle import make_bundle
    from ctrctl.inference.retrieval import export_retrieval

    with locked(out, "quantize"):
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".retrieval-", dir=out.parent) as tmp:
            export_retrieval(checkpoint, index, Path(tmp) / "retrieval", dtype=dtype,
                             dataset=dataset, tracker=tracker)
            info = make_bundle(Path(tmp) / "retrieval", ranker, out,
                               item_feature=item_feature, overwrite=overwrite,
                               tracker=tracker, register=register_as)
    console.print(f"bundle: {out} (retrieval: {info['retrieval']['index_kind']} index of "
                  f"{info['retrieval']['items'] or 0:,} items; ranker reads the item id as "
                  f"{info['item_feature']!r})", markup=False)
    if info.get("model_uri"):
        console.print(f"registered: {info['model_uri']}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize_command)
