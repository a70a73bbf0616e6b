"""``ctrctl index``: a faiss index of a two-tower model's items."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ctrctl.cli.common import OutDir, Overwrite, console, locked


def index_command(
    checkpoint: Annotated[Path, typer.Option(
        help="A two-tower training run (model.kind: two_tower) or one of its checkpoints.")],
    out: OutDir,
    kind: Annotated[str, typer.Option(
        help="flat (exact), sq8 (INT8 codes, exact scan), ivf, hnsw or ivfpq (PQ codes).")
    ] = "hnsw",
    param: Annotated[list[str] | None, typer.Option(
        help="NAME=VALUE, repeated, over the defaults that fit the item count: ivf/ivfpq "
             "nlist, nprobe (ivfpq also m, nbits); hnsw M, efConstruction, efSearch.")] = None,
    dataset: Annotated[Path | None, typer.Option(
        help="Dataset of the items (default: the one the model was trained on).")] = None,
    k: Annotated[int, typer.Option(min=1, help="Cut-off of the recall against exact.")] = 100,
    overwrite: Overwrite = False,
) -> None:
    """Embed every item with the item tower and write a faiss index, the item ids and a
    manifest with sha256 hashes; report build time, bytes and recall@K against exact."""
    from ctrctl.data.synthetic import parse_assignments
    from ctrctl.retrieval.indexing import index_checkpoint

    with locked(out, "index"):
        result = index_checkpoint(checkpoint, out, kind=kind, dataset=dataset, k=k,
                                  params=parse_assignments(param, int, "--param") or None,
                                  overwrite=overwrite)
    table = Table(title=f"{result['kind']} index of {result['items']:,} items in {out}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("parameters", ", ".join(f"{n}={v}" for n, v in result["params"].items())
                  or "-")
    table.add_row("build seconds", f"{result['build_seconds']:.3f}")
    table.add_row("bytes", f"{result['bytes']:,}")
    table.add_row(f"recall@{k} vs exact", f"{result[f'recall@{k}']:.4f}")
    table.add_row("queries/s, 1 thread: exact / index",
                  f"{result['exact_qps_1thread']:,.0f} / {result['index_qps_1thread']:,.0f}")
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("index")(index_command)
