"""The model a pipeline config describes: built from the config and a dataset manifest, its
state in and out of checkpoints, and a checkpoint loaded back for scoring.

``ctrctl.modules`` holds the layers (embedding bag collections, MLPs, interactions, DLRM);
this package puts them together as a pipeline YAML says, for training
(:mod:`ctrctl.training`), evaluation and quantization (:mod:`ctrctl.inference`), which
therefore need nothing from the training loop.

Example:
    >>> from ctrctl.models.scoring import load_model
    >>> model, manifest, config = load_model("runs/a")
"""
