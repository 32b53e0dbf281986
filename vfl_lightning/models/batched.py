"""Fully connected models evaluated at several parameter sets at once: M homogeneous party
encoders (fully connected ones, or FedVS's polynomial networks) as one grouped computation
(:class:`GroupedParties`), or one model at K perturbed parameter vectors (:func:`chain_forward`,
the zeroth-order queries), with batched matrix products instead of a Python loop."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.sgd import sgd

from vfl_lightning.models.encoders import MLPEncoder
from vfl_lightning.models.pn import PolynomialNetwork
from vfl_lightning.optim import plain_sgd_settings

ELEMENTWISE = (nn.Identity, nn.ReLU, nn.Tanh, nn.Sigmoid)


def _layer_signature(layer: nn.Module) -> tuple:
    if isinstance(layer, nn.Linear):
        return (nn.Linear, tuple(layer.weight.shape), layer.bias is not None)
    if isinstance(layer, (nn.Flatten, *ELEMENTWISE)):
        return (type(layer),)
    return (None,)


def linear_chain(module: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """``module`` as the chain of layers it computes, ``[(parameter prefix, layer)]``: an
    :class:`MLPEncoder` (its ``net``), a plain ``nn.Sequential`` (e.g. ``MLPHead``) or one
    ``nn.Linear``, made of Linear and elementwise layers (a Flatten only first); else None."""
    if isinstance(module, nn.Linear):
        return [("", module)]
    if type(module) is MLPEncoder:
        layers = [(f"net.{i}.", layer) for i, layer in enumerate(module.net)]
    elif isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward:
        layers = [(f"{i}.", layer) for i, layer in enumerate(module)]
    else:
        return None
    for position, (_, layer) in enumerate(layers):
        flatten_first = isinstance(layer, nn.Flatten) and position == 0 and layer.start_dim == 1
        if not (isinstance(layer, (nn.Linear, *ELEMENTWISE)) or flatten_first):
            return None
    return layers


def chain_forward(
    chain: Sequence[tuple[str, nn.Module]], parameters: dict[str, torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """The chain (:func:`linear_chain`) with its parameters taken from ``parameters`` (by name)
    instead of the layers' own.

    Stacked parameters, shape ``(K, *shape)``, evaluate K models at once: ``x`` of shape
    ``(B, ...)`` is shared by all K, and the result has shape ``(K, B, out)``; each linear layer is
    one batched matrix product. Unstacked parameters act like ``torch.func.functional_call`` (any
    leading dimensions of ``x`` broadcast).
    """
    hidden = x
    for prefix, layer in chain:
        if isinstance(layer, nn.Flatten):
            hidden = hidden.reshape(hidden.shape[0], -1)
        elif isinstance(layer, nn.Linear):
            weight = parameters[f"{prefix}weight"]
            bias = parameters.get(f"{prefix}bias")
            if weight.dim() == 2:
                hidden = F.linear(hidden, weight, bias)
                continue
            if hidden.dim() == 2:
                hidden = hidden.expand(weight.shape[0], *hidden.shape)
            weight = weight.transpose(1, 2)
            if bias is None:
                hidden = torch.bmm(hidden, weight)
            else:
                hidden = torch.baddbmm(bias.unsqueeze(1), hidden, weight)
        else:
            hidden = layer(hidden)
    return hidden


def groupable(parties: Sequence[nn.Module]) -> bool:
    """True when every party is an :class:`MLPEncoder` with the same input shape and the same
    layers (types and weight shapes), or every party a :class:`PolynomialNetwork` of the same
    input shape, degree and width, so the M forwards can run as one grouped computation."""
    if len(parties) >= 2 and all(type(p) is PolynomialNetwork for p in parties):
        first = parties[0]
        shape = (first.input_shape, first.degree, tuple(first.weight.shape))
        return all((p.input_shape, p.degree, tuple(p.weight.shape)) == shape for p in parties)
    if len(parties) < 2 or not all(type(p) is MLPEncoder for p in parties):
        return False
    first = parties[0]
    signature = [_layer_signature(layer) for layer in first.net]
    if any(s == (None,) for s in signature):
        return False
    return all(
        p.input_shape == first.input_shape
        and [_layer_signature(layer) for layer in p.net] == signature
        for p in parties[1:]
    )


class GroupedParties:
    """h_m = party_m(x_m) for every m as one (M, B, P) tensor, for :func:`groupable` parties: each
    linear layer is one batched matrix product over the parties' stacked weights. Equal to the
    loop up to float rounding: a batched GEMM may sum in another order (bit-identical on the CPU
    builds measured here).

    The parties stay separate modules with separate parameters, optimizers and checkpoint keys,
    but their parameters live in shared storage: per parameter name one stacked leaf tensor
    (``stacked[name]``, shape (M, *shape)) of which every party's parameter is a view, so the
    forward reads the stack without copying it and the backward leaves one (M, *shape) gradient
    per name in ``stacked[name].grad``. Then either :meth:`step` updates the stacks in one foreach
    SGD step (each party optimizer's momentum buffer a view of one stacked buffer), or
    :meth:`distribute_gradients` hands each party its slice as ``.grad`` for its own optimizer.
    If a party's parameters stop being views (moved to another device or dtype, replaced), the
    next forward re-stacks them from their current values.
    """

    def __init__(self, parties: Sequence[MLPEncoder | PolynomialNetwork]) -> None:
        if not groupable(parties):
            raise ValueError(
                "GroupedParties needs MLPEncoder (or PolynomialNetwork) parties of one architecture"
            )
        self.parties = list(parties)
        self._buffers: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
        self._collect()

    def _collect(self) -> None:
        """The first party's chain without its Flatten, and per linear layer the M parties'
        parameters (by reference) under that layer's names; then bind them to stacks. Polynomial
        networks: their one ``weight`` each, and no chain."""
        if isinstance(self.parties[0], PolynomialNetwork):
            self.chain = None
            self.members = {"weight": [p.get_parameter("weight") for p in self.parties]}
            self._first_linear = self.parties[0]
            self._first = self._first_linear.weight
            self._bind()
            return
        chain = linear_chain(self.parties[0])
        self.chain = [
            (prefix, layer) for prefix, layer in chain if not isinstance(layer, nn.Flatten)
        ]
        self.members: dict[str, list[torch.Tensor]] = {}
        for prefix, layer in self.chain:
            if isinstance(layer, nn.Linear):
                names = ["weight"] if layer.bias is None else ["weight", "bias"]
                for name in names:
                    self.members[prefix + name] = [
                        p.get_parameter(prefix + name) for p in self.parties
                    ]
        self._first_linear = next(layer for _, layer in self.chain if isinstance(layer, nn.Linear))
        self._first = self._first_linear.weight
        self._bind()

    def _bind(self) -> None:
        """Stack every party's parameter values per name into one leaf and make each party's
        parameter a view of its row (the values do not change)."""
        self.stacked: dict[str, torch.Tensor] = {}
        self._views: list[torch.Tensor] = []
        with torch.no_grad():
            for name, members in self.members.items():
                stack = torch.stack([p.detach() for p in members]).requires_grad_()
                for m, p in enumerate(members):
                    p.data = stack.data[m]
                    self._views.append(p)
                self.stacked[name] = stack
        self._pointers = [p.data_ptr() for p in self._views]
        self._buffers = {}

    def _bound(self) -> bool:
        return self._first_linear.weight is self._first and self._pointers == [
            p.data_ptr() for p in self._views
        ]

    def __call__(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        if self._first_linear.weight is not self._first:  # parameters replaced: re-collect
            self._collect()
        elif not self._bound():  # moved to another device or dtype: re-stack
            self.distribute_gradients()
            self._bind()
        hidden = torch.stack([x.reshape(x.shape[0], -1) for x in xs])
        if self.chain is None:  # polynomial networks: power features times the stacked weights
            return torch.bmm(self.parties[0].powers(hidden), self.stacked["weight"])
        return chain_forward(self.chain, self.stacked, hidden)

    def zero_grad(self) -> None:
        """Drop the stacks' gradients (the parties' ``zero_grad`` leaves them alone)."""
        for stack in self.stacked.values():
            stack.grad = None

    def distribute_gradients(self) -> None:
        """Move each stack's gradient to the parties: party m's parameter gets row m as its
        ``.grad`` (added to a gradient it already has)."""
        for name, stack in self.stacked.items():
            gradient, stack.grad = stack.grad, None
            if gradient is None:
                continue
            for p, row in zip(self.members[name], gradient.unbind(0), strict=True):
                p.grad = row if p.grad is None else p.grad + row

    def step(self, optimizers: Sequence[torch.optim.Optimizer]) -> bool:
        """One foreach SGD update of every stack from its gradient, if ``optimizers`` (party m's
        at position m, each holding exactly that party's parameters) are plain SGD with one set
        of hyperparameters and no party parameter has a gradient of its own; then True. Each
        party optimizer keeps its momentum buffer as a view of a stacked buffer (re-stacked from
        the optimizers' own buffers when those were replaced, e.g. by a checkpoint load), so the
        values are those of M separate SGD steps, and each party's ``.grad`` is then its row of
        the step's gradient. Otherwise nothing happens and False."""
        if len(optimizers) != len(self.parties):
            return False
        if any(p.grad is not None for p in self._views):
            return False
        settings = plain_sgd_settings(optimizers)
        if settings is None or not self._own_parameters(optimizers):
            return False
        names = [name for name, stack in self.stacked.items() if stack.grad is not None]
        if not names:
            return True
        momentum = settings["momentum"] != 0
        buffers = [self._momentum_buffer(name, optimizers) for name in names] if momentum else []
        if momentum and any(b is False for b in buffers):
            return False
        stacks = [self.stacked[name] for name in names]
        grads = [stack.grad for stack in stacks]
        with torch.no_grad():
            sgd(stacks, grads, buffers, foreach=True, **settings)
        for name, buffer in zip(names, buffers, strict=False):
            if self._buffers.get(name, (None,))[0] is not buffer:  # created by this step
                self._adopt_buffer(name, buffer, optimizers)
        # each party keeps its gradient of this step as ``.grad`` (a row of the stacked one), as
        # after its own optimizer's step
        self.distribute_gradients()
        return True

    def _own_parameters(self, optimizers: Sequence[torch.optim.Optimizer]) -> bool:
        """Whether optimizer m holds exactly party m's grouped parameters (checked once per set
        of optimizer objects)."""
        key = tuple(id(opt) for opt in optimizers)
        if getattr(self, "_checked_optimizers", None) == key:
            return True
        for m, opt in enumerate(optimizers):
            held = {id(p) for group in opt.param_groups for p in group["params"]}
            mine = {id(members[m]) for members in self.members.values()}
            if held != mine:
                return False
        self._checked_optimizers = key
        return True

    def _momentum_buffer(self, name: str, optimizers) -> torch.Tensor | None | bool:
        """The stacked momentum buffer of ``name`` whose rows the optimizers hold (re-stacked
        from theirs when they hold others), None before the first step, False when only some
        parties have one."""
        members = self.members[name]
        held = [opt.state[p].get("momentum_buffer") for opt, p in zip(optimizers, members)]
        entry = self._buffers.get(name)
        if entry is not None and all(map(operator.is_, held, entry[1])):
            return entry[0]
        if all(h is None for h in held):
            return None
        if any(h is None for h in held):
            return False
        buffer = torch.stack(held)
        self._adopt_buffer(name, buffer, optimizers)
        return buffer

    def _adopt_buffer(self, name: str, buffer: torch.Tensor, optimizers) -> None:
        views = list(buffer.unbind(0))
        for opt, p, view in zip(optimizers, self.members[name], views, strict=True):
            opt.state[p]["momentum_buffer"] = view
        self._buffers[name] = (buffer, views)
