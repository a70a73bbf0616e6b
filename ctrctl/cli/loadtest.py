"""``ctrctl loadtest``: drive a running ranker with MLPerf's LoadGen and report latencies."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def loadtest_command(
    url: Annotated[str, typer.Argument(help="The server, e.g. http://127.0.0.1:8080.")],
    model: Annotated[Path, typer.Option(help="The export folder the server runs (its schema "
                                             "reads --input; a bundle with --protocol "
                                             "recommend).")],
    input: Annotated[Path, typer.Option("--input", help="Raw logs to sample rows from.")],
    rates: Annotated[str, typer.Option(help="Offered requests/s, comma-separated.")] = "5,10,20",
    duration_s: Annotated[float, typer.Option(help="Seconds per rate.")] = 20.0,
    candidates: Annotated[str, typer.Option(
        help="Rows per request: a number, or dlrmv2 (100-700, mean ~270).")] = "270",
    p99_ms: Annotated[float, typer.Option(help="The latency bound to find the rate for.")] = 10.0,
    protocol: Annotated[str, typer.Option(
        help="ctrctl (/v1/score), mlflow (/invocations of `mlflow models serve`) or "
             "recommend (/v1/recommend of a served bundle: --candidates ranked, --k "
             "returned).")] = "ctrctl",
    k: Annotated[int, typer.Option(help="--protocol recommend: items returned.")] = 10,
    threads: Annotated[int, typer.Option(help="Client connections.")] = 32,
    out: Annotated[Path | None, typer.Option(help="Write the points as JSON here.")] = None,
) -> None:
    """Sweep offered rates (Poisson arrivals); report achieved rate, p50-p99.9, errors, shed."""
    from rich.table import Table

    from ctrctl.cli.common import console
    from ctrctl.errors import ConfigError
    from ctrctl.serving.loadtest import RequestSet, highest_rate, read_raw_rows, sweep

    if protocol not in ("ctrctl", "mlflow", "recommend"):
        raise ConfigError(f"unknown protocol {protocol!r}", where="--protocol",
                          hint="ctrctl, mlflow or recommend")
    try:
        offered = [float(r) for r in rates.split(",") if r.strip()]
    except ValueError:
        raise ConfigError(f"{rates!r} is not a list of numbers", where="--rates") from None
    if protocol == "recommend":
        from ctrctl.serving.loadtest import recommend_queries

        requests = RequestSet.recommend(recommend_queries(model, input), k, int(candidates))
    else:
        rows = read_raw_rows(model, input)
        requests = RequestSet.sample(rows, candidates if candidates == "dlrmv2"
                                     else int(candidates), protocol=protocol)
    points = sweep(url, requests, offered, duration_s, protocol=protocol, threads=threads,
                   p99_ms=p99_ms)
    table = Table("offered/s", "achieved/s", "rows/s", "p50 ms", "p95 ms", "p99 ms",
                  "p99.9 ms", "errors", "shed")
    for p in points:
        table.add_row(f"{p.offered_qps:g}", f"{p.achieved_qps:.1f}", f"{p.rows_per_s:,.0f}",
                      f"{p.p50_ms:.1f}", f"{p.p95_ms:.1f}", f"{p.p99_ms:.1f}",
                      f"{p.p999_ms:.1f}", str(p.errors), str(p.shed))
    console.print(table)
    best = highest_rate(points, p99_ms)
    console.print(f"highest rate at p99 <= {p99_ms:g} ms: "
                  + (f"{best.offered_qps:g} requests/s" if best else "none of those offered"))
    if out is not None:
        from ctrctl.io import write_json_atomic

        write_json_atomic(out, {"points": [p.to_dict() for p in points],
                                "highest_rate": best.offered_qps if best else None,
                                "p99_ms": p99_ms})
        console.print(f"-> {out}")


def register(app: typer.Typer) -> None:
    app.command("loadtest")(loadtest_command)
