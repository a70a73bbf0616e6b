"""ctrctl: click-through-rate pipelines from raw logs to a sharded, trained, evaluated model.

Every CLI command is a thin wrapper over a function reachable from here, so a notebook needs
no typer. Names are loaded on first use: ``import ctrctl`` stays fast and has no side effects
(nothing touches torch.distributed, MLflow or the disk).

Example:
    >>> import ctrctl
    >>> ctrctl.synthesize("logs", rows=100_000)                       # ctrctl synth
    >>> ctrctl.preprocess("schemas/criteo_vocab.yaml",
    ...                   ["train=logs/train.tsv", "val=logs/val.tsv"], "dataset")
    >>> cfg = ctrctl.load_config("pipelines/demo.yaml", ["training.epochs=1"])
    >>> ctrctl.train("dataset", "run", cfg)                           # ctrctl train
    >>> ctrctl.evaluate(checkpoint="run", dataset="dataset", split="val", out="eval")
"""

from __future__ import annotations

import importlib
from typing import Any

from ctrctl.compat import ctrctl_version
from ctrctl.errors import CtrctlError

#: The installed distribution's version: pyproject.toml is the one place it is written.
__version__ = ctrctl_version()

#: public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # data
    "synthesize": "ctrctl.data.synthetic",
    "preprocess": "ctrctl.data.preprocess",
    "load_schema": "ctrctl.data.schema",
    "Schema": "ctrctl.data.schema",
    "DatasetManifest": "ctrctl.data.manifest",
    "BatchLoader": "ctrctl.data.dataset",
    "Batch": "ctrctl.data.batch",
    # config
    "load_config": "ctrctl.config",
    "PipelineConfig": "ctrctl.config",
    # sparse + modules
    "JaggedTensor": "ctrctl.sparse",
    "KeyedJaggedTensor": "ctrctl.sparse",
    "KeyedTensor": "ctrctl.sparse",
    "EmbeddingBagConfig": "ctrctl.modules",
    "EmbeddingBagCollection": "ctrctl.modules",
    "EmbeddingOptimizerConfig": "ctrctl.modules",
    "DLRM": "ctrctl.modules",
    # distributed
    "ShardingPlan": "ctrctl.distributed.types",
    "ShardingType": "ctrctl.names",
    "DistributedModelParallel": "ctrctl.distributed.model_parallel",
    "shard": "ctrctl.distributed.model_parallel",
    "EmbeddingShardingPlanner": "ctrctl.distributed.planner",
    "Topology": "ctrctl.distributed.planner",
    # training, evaluation
    "train": "ctrctl.training.loop",
    "load_model": "ctrctl.models.scoring",
    "predict_split": "ctrctl.models.scoring",
    "evaluate": "ctrctl.evaluation",
    # hyperparameter search
    "tune": "ctrctl.tuning",
    "TuneRequest": "ctrctl.tuning",
    # metrics (torchmetrics Metrics, usable in any training loop)
    "CTRMetrics": "ctrctl.metrics",
    "StreamingAUC": "ctrctl.metrics",
    "roc_auc": "ctrctl.metrics",
    # inference
    "QuantEmbeddingBagCollection": "ctrctl.modules.quant_embedding",
    "QuantizeConfig": "ctrctl.inference.quantize",
    "quantize_checkpoint": "ctrctl.inference.quantize",
    "quantize_to_artifact": "ctrctl.inference.export",
    "write_artifact": "ctrctl.inference.export",
    "load_artifact": "ctrctl.inference.export",
    "predict_dataset": "ctrctl.inference.predictor",
    "predict_raw": "ctrctl.inference.predictor",
    # the whole pipeline
    "run_pipeline": "ctrctl.runner",
    # tracking
    "make_tracker": "ctrctl.tracking",
}

__all__ = ["CtrctlError", "__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ctrctl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
