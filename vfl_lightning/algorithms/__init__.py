"""Protocols as LightningModules (manual optimization): one class per protocol family.

The classes are imported on first use, so the plain-torch helpers (``zoo``, ``staleness``) load
without Lightning.
"""

from importlib import import_module

_CLASSES = {
    "FedBCD": "fedbcd",
    "FedVSFamily": "fedvs",
    "HybridVFL": "asynchronous",
    "SyncVFL": "sync",
    "VFLModule": "base",
}

__all__ = sorted(_CLASSES)


def __getattr__(name: str):
    if name in _CLASSES:
        return getattr(import_module(f"{__name__}.{_CLASSES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
