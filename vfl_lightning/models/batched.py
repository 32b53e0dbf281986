"""Fully connected models evaluated at several parameter sets at once: M homogeneous party
encoders as one grouped computation (:class:`GroupedParties`), or one model at K perturbed
parameter vectors (:func:`chain_forward`, the zeroth-order queries), with batched matrix products
instead of a Python loop."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from vfl_lightning.models.encoders import MLPEncoder

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
    layers (types and weight shapes), so the M forwards can run as one grouped computation."""
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
    linear layer is one batched matrix product over the parties' stacked weights, and gradients
    reach every party's own parameters through the stack (the parties stay separate modules with
    separate optimizers). Equal to the loop up to float rounding: a batched GEMM may sum in
    another order (bit-identical on the CPU builds measured here).
    """

    def __init__(self, parties: Sequence[MLPEncoder]) -> None:
        if not groupable(parties):
            raise ValueError("GroupedParties needs MLPEncoder parties of one architecture")
        self.parties = list(parties)
        self._collect()

    def _collect(self) -> None:
        """The first party's chain without its Flatten, and per linear layer the M parties'
        parameters (by reference) under that layer's names."""
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

    def __call__(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        if (
            self._first_linear.weight is not self._first
        ):  # parameters replaced (e.g. moved): re-collect
            self._collect()
        hidden = torch.stack([x.reshape(x.shape[0], -1) for x in xs])
        stacked = {name: torch.stack(members) for name, members in self.members.items()}
        return chain_forward(self.chain, stacked, hidden)
