"""The steps of ``ctrctl run`` that a two-tower pipeline (``model.kind: two_tower``) takes
differently from a ranker's: the item index, retrieval eval, the retrieval export.

    index/        index: the faiss index of every item, item ids, manifest (ctrctl index)
    eval/         eval: full-ranking recall and NDCG of the model, the index, popularity
                  and BPR on the eval split (metrics.json)
    export/       quantize: the query tower (INT8 tables) and the index, hashed
                  (:mod:`ctrctl.inference.retrieval`)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctrctl.errors import ConfigError

if TYPE_CHECKING:
    from ctrctl.config import PipelineConfig
    from ctrctl.runner.steps import Context

#: The retrieval figure a two-tower eval step reports first.
RETRIEVAL_KEY = "recall@100"


def is_two_tower(cfg: PipelineConfig) -> bool:
    """Whether the pipeline trains a two-tower retrieval model."""
    return cfg.model.kind == "two_tower"


def check_retrieval_pipeline(cfg: PipelineConfig, where: str) -> None:
    """What a two-tower pipeline cannot ask for, named before any step runs."""
    if is_two_tower(cfg) and cfg.eval.gates:
        raise ConfigError("eval.gates check a ranker's metrics (auc, logloss, ...); this "
                          "pipeline trains a two-tower retrieval model", where=where,
                          hint="drop eval.gates for a two-tower pipeline")


# ---- index -----------------------------------------------------------------------------
def no_index(ctx: Context) -> str | None:
    return None if is_two_tower(ctx.cfg) else "model.kind is not two_tower"


def index_settings(ctx: Context) -> dict[str, Any]:
    return ctx.cfg.index.model_dump(mode="json")


def run_index(ctx: Context, resume: bool) -> dict[str, Any]:
    from ctrctl.retrieval.indexing import index_checkpoint

    s = ctx.cfg.index
    result = index_checkpoint(ctx.checkpoint(), ctx.index, kind=s.kind,
                              params=dict(s.params) or None, dataset=ctx.dataset, k=s.k,
                              overwrite=True)
    return {f"recall@{s.k}": result[f"recall@{s.k}"], "kind": result["kind"],
            "items": result["items"], "bytes": result["bytes"],
            "build_seconds": result["build_seconds"],
            "exact_qps_1thread": result["exact_qps_1thread"],
            "index_qps_1thread": result["index_qps_1thread"]}


# ---- eval ------------------------------------------------------------------------------
def run_retrieval_eval(ctx: Context) -> dict[str, Any]:
    """Full ranking of every item on the eval split: the model exact and through the
    index, popularity and BPR beside it (:func:`ctrctl.retrieval.evaluate.evaluate_retrieval`)."""
    from ctrctl.retrieval.evaluate import evaluate_retrieval

    index = ctx.index if (ctx.index / "manifest.json").is_file() else None
    metrics = evaluate_retrieval(ctx.checkpoint(), ctx.eval, dataset=ctx.dataset,
                                 split=ctx.cfg.runner.eval_split, index=index,
                                 overwrite=True, tracker=ctx.tracker)
    numbers = {k: v for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {RETRIEVAL_KEY: numbers.get(RETRIEVAL_KEY), **numbers, "gates_passed": True,
            "gates": []}


# ---- quantize: the retrieval export ----------------------------------------------------
def run_retrieval_export(ctx: Context) -> dict[str, Any]:
    """The query tower with ``quantize.dtype`` tables and the index, as one hashed folder
    (:func:`ctrctl.inference.retrieval.export_retrieval`), logged as the step's model."""
    from ctrctl.inference.retrieval import export_retrieval

    exported = export_retrieval(ctx.checkpoint(), ctx.index, ctx.export,
                                dtype=ctx.cfg.quantize.dtype, overwrite=True,
                                tracker=ctx.tracker, log_model=ctx.tracker.enabled)
    return {"bytes.ratio": exported.quantized_bytes / max(exported.fp32_bytes, 1),
            "bytes.quantized": exported.quantized_bytes,
            **({"model_uri": exported.model_uri} if exported.model_uri else {})}
