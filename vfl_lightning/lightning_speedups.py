"""Fast paths for Lightning's fixed per-call costs, behind one switch: the root config key
``lightning_speedups`` (default true; ``false`` runs Lightning exactly as it is). Every path gives
the same parameters and calls the same hooks (tests/test_speed.py).

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
model's whole step (``self.log`` during training and every evaluation batch ask too). The answer
depends only on the function's signature, so :func:`install` gives the training and evaluation
loops and ``LightningModule`` a memoized copy, keyed by the function (a bound method's
``__func__``) and the question's arguments. Other callables (a ``functools.partial``, an object
with ``__call__``) are asked afresh every time, as Lightning does.

**Per state question.** Lightning's enums (``RunningStage``, ``TrainerFn``) compare by their
lower-cased string values; the fast path answers a member compared with itself (the trainer's
``training`` property, asked a dozen times per batch) without building the strings.

**Per hook.** Every hook Lightning calls (a dozen per training batch) goes through
``trainer/call.py``, which calls each callback's method (also the base ``Callback``'s empty ones)
inside ``trainer.profiler.profile(...)`` with a name built for the profiler, and picks where the
three batch-transfer hooks live by asking ``is_overridden`` of the module and the data module
every time: together about 30-40 µs a batch with the default callbacks. With the default
:class:`~lightning.pytorch.profilers.PassThroughProfiler` (whose ``profile`` does nothing) the
fast paths call the same methods in the same order without that context, skip the base
``Callback``'s empty methods (a callback that defines the hook, on its class or its instance, is
called), and keep the batch-transfer hook's owner per data-hook selector (made once per fit).
Any other profiler, or ``monitoring_callbacks``, takes Lightning's own code.

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
    """(owner, attribute, fast-path maker) of every fast path, or None without those modules."""
    try:
        from lightning.pytorch.core import module
        from lightning.pytorch.loops import evaluation_loop, training_epoch_loop
        from lightning.pytorch.trainer import call
        from lightning.pytorch.trainer.connectors.data_connector import _DataHookSelector
        from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultMetric
        from lightning.pytorch.utilities import signature_utils
        from lightning_utilities.core.enums import StrEnum
    except ImportError:
        return None
    signature = _shared_signature_check(signature_utils.is_param_in_hook_signature)
    return [
        (_ResultMetric, "to", same_device_to),
        (training_epoch_loop, "is_param_in_hook_signature", signature),
        (evaluation_loop, "is_param_in_hook_signature", signature),
        (module, "is_param_in_hook_signature", signature),
        (call, "_call_callback_hooks", direct_callback_hooks),
        (call, "_call_lightning_module_hook", direct_module_hook),
        (_DataHookSelector, "get_instance", kept_hook_owner),
        (StrEnum, "__eq__", identity_first_eq),
    ]


_SHARED: dict[int, object] = {}


def _shared_signature_check(original):
    """One memoized check (:func:`memoized_signature_check`) for every place that imported
    ``original``, so they share its answers."""

    def make(current):
        if current is not original:  # already replaced, or Lightning changed: leave it
            return current
        if id(original) not in _SHARED:
            _SHARED[id(original)] = memoized_signature_check(original)
        return _SHARED[id(original)]

    return make


def install() -> bool:
    """Install every fast path (once); whether all are in place."""
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
    """Install every fast path (``enabled``) or run Lightning as it is; whether they are in place."""
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
        if fast is original:
            return False
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


def _pass_through_check():
    """``passes_through(trainer)``: whether the trainer's profiler is Lightning's do-nothing one
    (exactly that class) and Lightning's hook dispatch logs nothing (its debug lines name every
    hook called)."""
    import logging

    from lightning.pytorch.profilers import PassThroughProfiler
    from lightning.pytorch.trainer import call

    def passes_through(trainer) -> bool:
        return type(trainer.profiler) is PassThroughProfiler and not call.log.isEnabledFor(
            logging.DEBUG
        )

    return passes_through


def _empty_callback_hooks() -> dict[str, object]:
    """The base ``Callback``'s hook functions whose body is empty (docstring only), by name."""
    from lightning.pytorch.callbacks import Callback

    def empty():
        """An empty body."""

    hooks = {}
    for name in dir(Callback):
        function = getattr(Callback, name)
        code = getattr(function, "__code__", None)
        if name.startswith("on_") and code is not None and code.co_code == empty.__code__.co_code:
            hooks[name] = function
    return hooks


def direct_callback_hooks(original):
    """Lightning's ``_call_callback_hooks`` (``original``) without the profiler's context and
    without the base ``Callback``'s empty methods, when the profiler does nothing (see the module
    docstring); ``_current_fx_name`` is set and restored as Lightning does."""
    empty = _empty_callback_hooks()
    passes_through = _pass_through_check()

    @functools.wraps(original)
    def call_callback_hooks(trainer, hook_name, *args, monitoring_callbacks=None, **kwargs):
        if monitoring_callbacks is not None or not passes_through(trainer):
            return original(
                trainer, hook_name, *args, monitoring_callbacks=monitoring_callbacks, **kwargs
            )
        pl_module = trainer.lightning_module
        if pl_module:
            previous = pl_module._current_fx_name
            pl_module._current_fx_name = hook_name
        base = empty.get(hook_name)
        for callback in trainer.callbacks:
            fn = getattr(callback, hook_name)
            if base is not None and getattr(fn, "__func__", None) is base:
                continue
            if callable(fn):
                fn(trainer, trainer.lightning_module, *args, **kwargs)
        if pl_module:
            pl_module._current_fx_name = previous
        return None

    return call_callback_hooks


def direct_module_hook(original):
    """Lightning's ``_call_lightning_module_hook`` (``original``) without the profiler's context
    when the profiler does nothing; otherwise Lightning's own code."""
    passes_through = _pass_through_check()

    @functools.wraps(original)
    def call_module_hook(trainer, hook_name, *args, pl_module=None, **kwargs):
        if not passes_through(trainer):
            return original(trainer, hook_name, *args, pl_module=pl_module, **kwargs)
        pl_module = pl_module or trainer.lightning_module
        if pl_module is None:
            raise TypeError("No `LightningModule` is available to call hooks on.")
        fn = getattr(pl_module, hook_name)
        if not callable(fn):
            return None
        previous = pl_module._current_fx_name
        pl_module._current_fx_name = hook_name
        output = fn(*args, **kwargs)
        pl_module._current_fx_name = previous
        return output

    return call_module_hook


def kept_hook_owner(original):
    """``_DataHookSelector.get_instance`` (``original``) answered once per (selector, hook, module,
    data module): whether the module or the data module overrides a batch-transfer hook does not
    change while one selector (one fit) lives."""

    @functools.wraps(original)
    def get_instance(self, hook_name):
        kept = self.__dict__.setdefault("_vfl_hook_owners", {})
        key = (hook_name, id(self.model), id(self.datamodule))
        owner = kept.get(key)
        if owner is None:
            owner = kept[key] = original(self, hook_name)
        return owner

    return get_instance


def identity_first_eq(original):
    """``StrEnum.__eq__`` (``original``: Lightning's enums compare their lower-cased values)
    answering True at once for the member itself, which the original also answers (the trainer
    asks ``state.stage == RunningStage.TRAINING`` a dozen times per batch)."""

    @functools.wraps(original)
    def __eq__(self, other):
        return other is self or original(self, other)

    return __eq__
