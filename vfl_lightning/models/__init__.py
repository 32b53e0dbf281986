"""Party encoders and fusion heads: the generic ones (mlp, cnn, linear, mlp) and the papers'
(ResNet-18 whole or split, FedBCD's MNIST CNN, VGG13, FedVS's Credit server)."""

from vfl_lightning.models.convnets import FedBCDCNN, VGG13Head
from vfl_lightning.models.encoders import CNNEncoder, MLPEncoder
from vfl_lightning.models.heads import BiasHead, CreditServerHead, LinearHead, MLPHead
from vfl_lightning.models.resnet import ResNet18Body, ResNet18Encoder, ResNet18Stem

__all__ = [
    "BiasHead",
    "CNNEncoder",
    "CreditServerHead",
    "FedBCDCNN",
    "LinearHead",
    "MLPEncoder",
    "MLPHead",
    "ResNet18Body",
    "ResNet18Encoder",
    "ResNet18Stem",
    "VGG13Head",
]
