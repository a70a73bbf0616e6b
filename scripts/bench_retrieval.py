"""Item index speed and recall at scale: faiss IVF and HNSW against exact search, one core.

Items are clustered unit vectors (:func:`~ctrctl.retrieval.synthetic.clustered_factors`:
1,024 centres, as learned item vectors group), queries drawn the same way. Exact search is
a flat inner-product scan; each index is searched with one thread at a few settings, and
recall@K is the share of the exact top K it returns. Bounded: the whole run takes a few
minutes on one Zen 4 core at 1M items.

    nice -n 5 python scripts/bench_retrieval.py --items 1000000 --dim 64 \
        --out benchmarks/results/amd-epyc-zen4/retrieval_index.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.modules.native import cpu_model
from ctrctl.retrieval.index import build_index, exact_search, recall_against_exact, search
from ctrctl.retrieval.synthetic import clustered_factors


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nprobe", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--hnsw-items", type=int, default=200_000,
                        help="HNSW is built on this many items (its build is the slow part)")
    parser.add_argument("--out", type=Path)
    return parser.parse_args(argv)


def qps(index: Any, queries: np.ndarray, k: int, repeats: int) -> tuple[float, list[float]]:
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        search(index, queries, k)
        rates.append(len(queries) / (time.perf_counter() - started))
    return statistics.median(rates), rates


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    import faiss

    args = parse_args(argv)
    faiss.omp_set_num_threads(1)
    items = clustered_factors(args.items, args.dim, seed=1, clusters=1024)
    queries = clustered_factors(args.queries, args.dim, seed=2, clusters=1024)
    results: dict[str, Any] = {
        "bench": "retrieval_index", "cpu": cpu_model(), "threads": 1, "items": args.items,
        "dim": args.dim, "queries": args.queries, "k": args.k, "repeats": args.repeats,
        "load_average_before": os.getloadavg(), "runs": []}
    flat = build_index(items, "flat")
    exact_qps, exact_rates = qps(flat.index, queries, args.k, args.repeats)
    exact = exact_search(items, queries, args.k)
    results["exact"] = {"qps_median": exact_qps, "qps": exact_rates}
    print(f"exact: {exact_qps:,.0f} q/s")
    ivf = build_index(items, "ivf")
    for nprobe in args.nprobe:
        ivf.index.nprobe = nprobe
        rate, rates = qps(ivf.index, queries, args.k, args.repeats)
        recall = recall_against_exact(ivf.index, items, queries, args.k, exact)
        results["runs"].append({"kind": "ivf", "items": args.items,
                                "params": {**ivf.params, "nprobe": nprobe},
                                "build_seconds": ivf.seconds, "bytes": ivf.bytes,
                                "qps_median": rate, "qps": rates, "speedup": rate / exact_qps,
                                f"recall@{args.k}": recall})
        print(f"ivf nprobe {nprobe}: {rate:,.0f} q/s ({rate / exact_qps:.1f}x), "
              f"recall@{args.k} {recall:.4f}, built in {ivf.seconds:.1f} s")
    sub = items[:args.hnsw_items]
    sub_exact_index = build_index(sub, "flat")
    sub_exact_qps, _ = qps(sub_exact_index.index, queries, args.k, args.repeats)
    sub_exact = exact_search(sub, queries, args.k)
    hnsw = build_index(sub, "hnsw")
    for ef in (128, 256):
        hnsw.index.hnsw.efSearch = ef
        rate, rates = qps(hnsw.index, queries, args.k, args.repeats)
        recall = recall_against_exact(hnsw.index, sub, queries, args.k, sub_exact)
        results["runs"].append({"kind": "hnsw", "items": len(sub),
                                "params": {**hnsw.params, "efSearch": ef},
                                "build_seconds": hnsw.seconds, "bytes": hnsw.bytes,
                                "qps_median": rate, "qps": rates,
                                "exact_qps_median": sub_exact_qps,
                                "speedup": rate / sub_exact_qps, f"recall@{args.k}": recall})
        print(f"hnsw ({len(sub):,} items) efSearch {ef}: {rate:,.0f} q/s "
              f"({rate / sub_exact_qps:.1f}x), recall@{args.k} {recall:.4f}, "
              f"built in {hnsw.seconds:.1f} s")
    results["load_average_after"] = os.getloadavg()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
