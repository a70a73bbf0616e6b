"""Embedding modules on FBGEMM's TBE (with a plain-torch kernel), MLPs, interactions, DLRM.

Example:
    >>> from ctrctl.modules import EmbeddingBagConfig, EmbeddingBagCollection
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig("t", 100, 8, ["f"])])
"""

from ctrctl.modules.batched_embedding import BatchedEmbeddingBag
from ctrctl.modules.collision_collection import ManagedCollisionCollection
from ctrctl.modules.collisions import CollisionConfig, CollisionRemapper
from ctrctl.modules.dlrm import DLRM, dlrm_loss
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.modules.interaction import DCNInteraction, DotInteraction, LowRankCrossNet
from ctrctl.modules.mlp import MLP
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig

__all__ = [
    "DLRM",
    "MLP",
    "BatchedEmbeddingBag",
    "CollisionConfig",
    "CollisionRemapper",
    "ManagedCollisionCollection",
    "DCNInteraction",
    "DotInteraction",
    "LowRankCrossNet",
    "dlrm_loss",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingOptimizerConfig",
]
