"""vfl_lightning: vertical federated learning protocols on PyTorch Lightning and Hydra."""

__version__ = "0.1.0"
