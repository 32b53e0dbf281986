"""Homogeneous parties as one grouped computation: M fully connected party encoders of the same
architecture evaluated with batched matrix products instead of a Python loop over parties."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vfl_lightning.models.encoders import MLPEncoder

ELEMENTWISE = (nn.Identity, nn.ReLU, nn.Tanh, nn.Sigmoid)


def _layer_signature(layer: nn.Module) -> tuple:
    if isinstance(layer, nn.Linear):
        return (nn.Linear, tuple(layer.weight.shape), layer.bias is not None)
    if isinstance(layer, (nn.Flatten, *ELEMENTWISE)):
        return (type(layer),)
    return (None,)


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
        """Per layer: (layer, the M weights, the M biases or None); parameters by reference."""
        self.layers = []
        for index, layer in enumerate(self.parties[0].net):
            if isinstance(layer, nn.Linear):
                weights = [p.net[index].weight for p in self.parties]
                biases = None if layer.bias is None else [p.net[index].bias for p in self.parties]
                self.layers.append((layer, weights, biases))
            elif not isinstance(layer, nn.Flatten):
                self.layers.append((layer, None, None))
        self._first = next(w for _, w, _ in self.layers if w is not None)[0]

    def __call__(self, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        first_linear = next(layer for layer, w, _ in self.layers if w is not None)
        if first_linear.weight is not self._first:  # parameters replaced (e.g. moved): re-collect
            self._collect()
        hidden = torch.stack([x.reshape(x.shape[0], -1) for x in xs])
        for layer, weights, biases in self.layers:
            if weights is None:
                hidden = layer(hidden)
                continue
            weight = torch.stack(weights).transpose(1, 2)
            if biases is None:
                hidden = torch.bmm(hidden, weight)
            else:
                hidden = torch.baddbmm(torch.stack(biases).unsqueeze(1), hidden, weight)
        return hidden
