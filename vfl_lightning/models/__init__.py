"""Party encoders (mlp, cnn) and fusion heads (linear, mlp)."""

from vfl_lightning.models.encoders import CNNEncoder, MLPEncoder
from vfl_lightning.models.heads import BiasHead, LinearHead, MLPHead

__all__ = ["BiasHead", "CNNEncoder", "LinearHead", "MLPEncoder", "MLPHead"]
