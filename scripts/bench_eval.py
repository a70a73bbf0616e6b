"""Streaming evaluation at scale: binned AUC against exact sorting, scikit-learn and torchmetrics.

On ``--rows`` synthetic CTR predictions (default 10M; ``--quick``: 1M) this measures, in one
process, as medians over ``--repeats``:

* ``streaming``: :class:`ctrctl.metrics.streaming.CTRMetrics` (a torchmetrics ``Metric``) with no rows held
  (2**20-bin histogram), fed chunk by chunk as a scoring loop would; peak memory is traced;
* ``exact``: the same accumulator holding every row and sorting once;
* ``sklearn``: the reference, ``roc_auc_score`` + ``average_precision_score`` + ``log_loss``
  on the whole arrays;
* ``torchmetrics``: its own ``BinaryAUROC`` and ``BinaryAveragePrecision`` with
  ``--thresholds`` thresholds (binned: constant memory, as the streaming path), fed the same
  chunks; the baseline a torchmetrics user would reach for.

It prints the AUC error of the streaming path beside its stated bound (the run fails if the
bound is broken), the times as ratios to scikit-learn, and the peak memory of each path.

Usage:
    python scripts/bench_eval.py [--quick] [--rows 10000000] [--out bench-out/eval.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import average_precision_score, log_loss, roc_auc_score

from ctrctl.evaluation.synthetic import synthetic_arrays, synthetic_predictions
from ctrctl.io import write_json_atomic
from ctrctl.metrics.streaming import CTRMetrics, Metrics


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M rows, 2 repeats")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=1 << 18, help="rows per update")
    parser.add_argument("--thresholds", type=int, default=100,
                        help="thresholds of torchmetrics' binned AUROC / average precision")
    parser.add_argument("--out", type=Path, default=Path("bench-out/eval.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeats = 1_000_000, 2
    return args


def streaming(rows: int, chunk_rows: int) -> Metrics:
    acc = CTRMetrics(exact_limit=0)
    for labels, scores in synthetic_predictions(rows, chunk_rows=chunk_rows):
        acc.update(labels, scores)
    return acc.compute()


def torchmetrics_binned(rows: int, chunk_rows: int, thresholds: int) -> dict[str, float]:
    """torchmetrics' binned AUROC and average precision over the same chunks."""
    import torch
    from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision

    auroc = BinaryAUROC(thresholds=thresholds)
    average_precision = BinaryAveragePrecision(thresholds=thresholds)
    for labels, scores in synthetic_predictions(rows, chunk_rows=chunk_rows):
        preds, target = torch.from_numpy(scores), torch.from_numpy(labels.astype(np.int64))
        auroc.update(preds, target)
        average_precision.update(preds, target)
    return {"auc": float(auroc.compute()), "pr_auc": float(average_precision.compute())}


def exact(labels: np.ndarray, scores: np.ndarray) -> Metrics:
    acc = CTRMetrics(exact_limit=labels.size)
    acc.update(labels, scores)
    return acc.compute()


def sklearn_metrics(labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    s = scores.astype(np.float64)
    return {"auc": roc_auc_score(labels, s), "pr_auc": average_precision_score(labels, s),
            "logloss": log_loss(labels, s)}


def in_memory(rows: int, repeats: int) -> tuple[dict[str, float], float, Metrics, float]:
    """scikit-learn and our exact path on every row held at once (freed on return)."""
    labels, scores = synthetic_arrays(rows)
    ref, t_ref = timed(lambda: sklearn_metrics(labels, scores), repeats)
    ours, t_ours = timed(lambda: exact(labels, scores), repeats)
    return ref, t_ref, ours, t_ours


def timed(fn: Callable[[], Any], repeats: int) -> tuple[Any, float]:
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return value, statistics.median(times)


def peak_mib(fn: Callable[[], Any]) -> float:
    """Peak traced allocation (numpy arrays included) while ``fn`` runs, in MiB."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = args.rows
    ref, t_ref, ours_exact, t_exact = in_memory(rows, args.repeats)
    ours_stream, t_stream = timed(lambda: streaming(rows, args.chunk_rows), args.repeats)
    mem_stream = peak_mib(lambda: streaming(rows, args.chunk_rows))
    mem_exact = peak_mib(lambda: exact(*synthetic_arrays(rows)))
    tm, t_tm = timed(lambda: torchmetrics_binned(rows, args.chunk_rows, args.thresholds),
                     args.repeats)

    error = abs(ours_stream.auc - ref["auc"])
    results = {
        "rows": rows,
        "repeats": args.repeats,
        "auc_sklearn": ref["auc"],
        "auc_exact": ours_exact.auc,
        "auc_streaming": ours_stream.auc,
        "auc_streaming_error": error,
        "auc_streaming_bound": ours_stream.auc_bound,
        "auc_exact_error": abs(ours_exact.auc - ref["auc"]),
        "pr_auc_streaming_error": abs(ours_stream.pr_auc - ref["pr_auc"]),
        "logloss_streaming_error": abs(ours_stream.logloss - ref["logloss"]),
        "ece_streaming_minus_exact": abs(ours_stream.ece - ours_exact.ece),
        "seconds_sklearn": t_ref,
        "seconds_exact": t_exact,
        "seconds_streaming": t_stream,
        "seconds_torchmetrics": t_tm,
        "torchmetrics_thresholds": args.thresholds,
        "auc_torchmetrics_error": abs(tm["auc"] - ref["auc"]),
        "pr_auc_torchmetrics_error": abs(tm["pr_auc"] - ref["pr_auc"]),
        "ratio_torchmetrics_vs_sklearn": t_ref / t_tm,
        "ratio_streaming_vs_torchmetrics": t_tm / t_stream,
        "ratio_exact_vs_sklearn": t_ref / t_exact,
        "ratio_streaming_vs_sklearn": t_ref / t_stream,
        "streaming_rows_per_s": rows / t_stream,
        "peak_mib_streaming": mem_stream,
        "peak_mib_exact": mem_exact,
        "bound_holds": error <= ours_stream.auc_bound,
    }
    print(f"eval, {rows:,} synthetic predictions, medians of {args.repeats}")
    print(f"{'path':<12}{'AUC':>12}{'|err| vs sklearn':>18}{'seconds':>10}"
          f"{'speed vs sklearn':>18}{'peak MiB':>10}")
    print(f"{'sklearn':<12}{ref['auc']:>12.8f}{0:>18.2e}{t_ref:>10.2f}{1.0:>18.2f}{'-':>10}")
    print(f"{'exact':<12}{ours_exact.auc:>12.8f}{results['auc_exact_error']:>18.2e}"
          f"{t_exact:>10.2f}{t_ref / t_exact:>18.2f}{mem_exact:>10.0f}")
    print(f"{'streaming':<12}{ours_stream.auc:>12.8f}{error:>18.2e}{t_stream:>10.2f}"
          f"{t_ref / t_stream:>18.2f}{mem_stream:>10.0f}")
    print(f"{'torchmetrics':<12}{tm['auc']:>12.8f}{results['auc_torchmetrics_error']:>18.2e}"
          f"{t_tm:>10.2f}{t_ref / t_tm:>18.2f}{'-':>10}"
          f"   ({args.thresholds} thresholds; PR-AUC error "
          f"{results['pr_auc_torchmetrics_error']:.2e})")
    print(f"streaming AUC bound {ours_stream.auc_bound:.2e} "
          f"({'holds' if results['bound_holds'] else 'BROKEN'}); "
          f"PR-AUC error {results['pr_auc_streaming_error']:.2e}, "
          f"logloss error {results['logloss_streaming_error']:.2e}")
    write_json_atomic(args.out, results)
    print(f"wrote {args.out}")
    return 0 if results["bound_holds"] else 1


if __name__ == "__main__":
    sys.exit(main())
