"""Party encoders (mlp, cnn) and fusion heads (linear, mlp)."""

from vfl_lightning.models.encoders import CNNEncoder, MLPEncoder
from vfl_lightning.models.heads import LinearHead, MLPHead

__all__ = ["CNNEncoder", "LinearHead", "MLPEncoder", "MLPHead"]
