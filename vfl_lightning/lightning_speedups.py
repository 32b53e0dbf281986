"""Fast paths for two of Lightning's fixed per-call costs, behind one switch: the root config key
``lightning_speedups`` (default true; ``false`` runs Lightning exactly as it is). Both paths give
the same parameters (tests/test_speed.py).

**Per ``self.log`` call.** Every ``self.log(name, value)`` ends in ``_ResultCollection.log``, which calls
``_ResultMetric.to(value.device)`` on the stored metric, also when it is already there. That
``to`` rebuilds the metric's whole ``__dict__`` (about 45 entries: module hooks, torchmetrics
bookkeeping, the metadata dataclass) through ``apply_to_collection``: about 0.45 ms on the
development machine, per logged key, per call, more than the rest of the call. A run logs a few
dozen keys per epoch (train, validation, the curve axes), so this was several percent of a small
model's run (``bench/time_to_result.py``).

:func:`install` wraps ``_ResultMetric.to`` so that a call with one ``torch.device`` argument on a
tensor-valued metric whose every state tensor (current value and default, per state) is already
on that device returns the metric at once, which is what the original does in effect (tensors on
their device are returned as they are). Any other call (another device, a dtype, keyword
arguments, a metric that wraps a torchmetrics ``Metric``) takes Lightning's own code.

**Per training batch.** Before every batch the training loop asks
``is_param_in_hook_signature(training_step, "batch_idx", min_args=2)``, which runs
``inspect.getfullargspec`` on the bound method: about 60 µs a batch, a twentieth of a small
model's whole step. The answer depends only on the function's signature, so :func:`install` gives
the training loop a memoized copy, keyed by the function (a bound method's ``__func__``) and the
question's arguments. Other callables (a ``functools.partial``, an object with ``__call__``) are
asked afresh every time, as Lightning does.

If Lightning's internals change so that a module or attribute is missing, that fast path is not
installed. :func:`use` installs both or puts Lightning's own functions back.
"""

from __future__ import annotations

import functools
import types

import torch

_MARK = "_vfl_fast_path"
"""Set on every function this module installed, so a second ``install`` changes nothing."""


def _on_device(metric, device: torch.device) -> bool:
    """Whether every state tensor of the tensor-valued ``metric`` is on ``device``."""
    state = metric.__dict__
    defaults = state.get("_defaults")
    if not state.get("is_tensor") or not isinstance(defaults, dict) or not defaults:
        return False
    for name, default in defaults.items():
        current = state.get(name)
        if not isinstance(current, torch.Tensor) or not isinstance(default, torch.Tensor):
            return False
        if current.device != device or default.device != device:
            return False
    computed = state.get("_computed")
    return computed is None or (isinstance(computed, torch.Tensor) and computed.device == device)


def _targets() -> list[tuple[object, str, object]] | None:
    """(owner, attribute, fast-path maker) of both fast paths, or None without those modules."""
    try:
        from lightning.pytorch.loops import training_epoch_loop
        from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultMetric
    except ImportError:
        return None
    return [
        (_ResultMetric, "to", same_device_to),
        (training_epoch_loop, "is_param_in_hook_signature", memoized_signature_check),
    ]


def install() -> bool:
    """Install both fast paths (once); whether both are in place."""
    targets = _targets()
    if targets is None:
        return False
    placed = [_replace_once(owner, name, make) for owner, name, make in targets]
    return all(placed)


def uninstall() -> None:
    """Put Lightning's own functions back where a fast path is installed."""
    for owner, name, _ in _targets() or []:
        current = getattr(owner, name, None)
        if getattr(current, _MARK, False):
            setattr(owner, name, current.__wrapped__)


def use(enabled: bool) -> bool:
    """Install both fast paths (``enabled``) or run Lightning as it is; whether they are in place."""
    if enabled:
        return install()
    uninstall()
    return False


def _replace_once(owner, name: str, make_fast_path) -> bool:
    """Replace ``owner.name`` by ``make_fast_path(original)`` unless already done; whether a
    fast path is in place (False when Lightning lacks that attribute)."""
    original = getattr(owner, name, None)
    if original is None:
        return False
    if not getattr(original, _MARK, False):
        fast = make_fast_path(original)
        setattr(fast, _MARK, True)
        setattr(owner, name, fast)
    return True


def same_device_to(original):
    """``_ResultMetric.to`` (``original``) returning the metric at once when it is asked for the
    device its every state tensor is already on (see the module docstring)."""

    @functools.wraps(original)
    def to(self, *args, **kwargs):
        same_device = len(args) == 1 and not kwargs and isinstance(args[0], torch.device)
        if same_device and _on_device(self, args[0]):
            return self
        return original(self, *args, **kwargs)

    return to


def memoized_signature_check(original):
    """``original`` (Lightning's ``is_param_in_hook_signature``) with its answers kept per
    (function, param, explicit, min_args) for functions and bound methods."""

    @functools.lru_cache(maxsize=256)
    def cached(function, param, explicit, min_args):
        return original(function, param, explicit, min_args)

    @functools.wraps(original)
    def check(hook_fx, param, explicit=False, min_args=None):
        function = hook_fx.__func__ if isinstance(hook_fx, types.MethodType) else hook_fx
        if isinstance(function, types.FunctionType):
            # the unbound function has the bound method's parameters, ``self`` first, so
            # Lightning's ``args[1:]`` reads the same parameters from either
            return cached(function, param, explicit, min_args)
        return original(hook_fx, param, explicit, min_args)

    return check
