"""Inference: quantize a checkpoint, place its tables on serving shards, export, predict.

Example:
    >>> from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
    >>> from ctrctl.inference.export import write_artifact, load_artifact
    >>> write_artifact(quantize_checkpoint("run", QuantizeConfig(dtype="int8")), "export")
    >>> load_artifact("export").predict_records([{"I1": "3", "C1": "68fd1e64"}])
"""
