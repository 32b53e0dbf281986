"""Optimizer helpers below every protocol: M plain-SGD optimizers with the same hyperparameters
step together through torch's foreach SGD (each keeping its own state); learning-rate scaling."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
from torch.optim.sgd import sgd

SGD_KEYS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")
_sgd_values = operator.itemgetter(*SGD_KEYS)


def zero_together(optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """``zero_grad()`` (set to None, torch's default) of every optimizer, in one Python loop."""
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = None


def plain_sgd_settings(optimizers: Sequence[torch.optim.Optimizer]) -> dict | None:
    """The shared SGD hyperparameters (``SGD_KEYS``) of ``optimizers`` if they are all plain
    ``torch.optim.SGD`` (not differentiable, not fused, a float lr) with one set of them, else
    None. Asked before every step, so it reads each parameter group once."""
    shared = None
    for opt in optimizers:
        if type(opt) is not torch.optim.SGD:
            return None
        for group in opt.param_groups:
            if group["differentiable"] or group["fused"] or not isinstance(group["lr"], float):
                return None
            values = _sgd_values(group)
            if shared is None:
                shared = values
            elif values != shared:
                return None
    return None if shared is None else dict(zip(SGD_KEYS, shared, strict=True))


def step_together(optimizers: Sequence[torch.optim.Optimizer]) -> bool:
    """Step ``optimizers`` as one foreach SGD update if they are all ``torch.optim.SGD`` with one
    set of hyperparameters (then return True); otherwise do nothing and return False.

    The foreach kernels apply the same per-element operations as M single-tensor steps
    (p -= lr (g + momentum buffer terms), the buffer created as a copy of the first gradient), so
    the parameters are bit-identical; each optimizer's momentum buffers stay in its own ``state``,
    so checkpoints hold one optimizer state per party.
    """
    settings = plain_sgd_settings(optimizers)
    if settings is None:
        return False
    pairs = [
        (opt, p)
        for opt in optimizers
        for group in opt.param_groups
        for p in group["params"]
        if p.grad is not None
    ]
    if not pairs:
        return True
    params = [p for _, p in pairs]
    grads = [p.grad for p in params]
    momentum = settings["momentum"] != 0
    buffers = [opt.state[p].get("momentum_buffer") for opt, p in pairs] if momentum else []
    created = momentum and any(buffer is None for buffer in buffers)
    with torch.no_grad():
        sgd(params, grads, buffers, foreach=True, **settings)
    if created:  # new buffers were made on this step; later steps update them in place
        for (opt, p), buffer in zip(pairs, buffers, strict=True):
            opt.state[p]["momentum_buffer"] = buffer
    return True


def scale_lr(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """lr = initial lr × ``factor`` for every parameter group (the initial lr is kept)."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * factor
