"""Zeroth-order optimization math (plain torch): random directions and the two-point gradient
estimator of the cascaded-hybrid paper (eq. 2-3), a client's query, flat parameter views."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from vfl_lightning.models.batched import chain_forward, linear_chain

DIRECTIONS = ("gaussian", "sphere")
ZOO_SPACES = ("params", "output")


def check_zoo_options(*, mu: float, num_directions: int, direction: str) -> None:
    """One clear error per bad zeroth-order option."""
    if not mu > 0:
        raise ValueError(f"algo.mu must be > 0, got {mu}")
    if int(num_directions) != num_directions or num_directions < 1:
        raise ValueError(f"algo.num_directions must be an integer >= 1, got {num_directions}")
    if direction not in DIRECTIONS:
        raise ValueError(f"algo.direction must be one of {DIRECTIONS}, got {direction!r}")


def direction_scale(direction: str, dimension: int) -> float:
    """phi(d) of eq. 2: 1 for standard normal directions, d for the uniform unit sphere."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    return 1.0 if direction == "gaussian" else float(dimension)


def sample_directions(
    num_directions: int,
    shape: Sequence[int],
    *,
    direction: str,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``num_directions`` random directions u of ``shape``: N(0, I), or uniform on the unit sphere
    of dimension prod(shape) (a normalized Gaussian). Returns shape (num_directions, *shape)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    device = generator.device if device is None else device
    u = torch.randn((num_directions, *shape), generator=generator, dtype=dtype, device=device)
    if direction == "sphere":
        norms = u.reshape(num_directions, -1).norm(dim=1)
        u = u / norms.reshape(num_directions, *([1] * len(shape)))
    return u


def two_point_estimate(
    loss: torch.Tensor,
    perturbed_losses: torch.Tensor,
    directions: torch.Tensor,
    *,
    mu: float,
    direction: str,
) -> torch.Tensor:
    """Eq. 3 averaged over q directions: (phi(d)/mu) * mean_k (h_hat_k - h) u_k.

    ``loss`` is h = f(w), ``perturbed_losses`` the q values f(w + mu u_k), ``directions`` the q
    directions u_k, shape (q, *shape); d = prod(shape). Compute the losses in float64: at mu =
    0.001 a float32 difference is mostly rounding.
    """
    differences = (perturbed_losses - loss).to(directions.dtype)
    scale = direction_scale(direction, prod(directions.shape[1:])) / mu
    weights = differences.reshape(-1, *([1] * (directions.dim() - 1)))
    return scale * (weights * directions).mean(dim=0)


Named = list[tuple[str, torch.Tensor]]
"""A module's ``named_parameters()`` as a list, read once and handed to the functions below
(each reading of a module's parameters walks its submodules)."""


def flat_parameters(
    module: nn.Module, dtype: torch.dtype = torch.float64, named: Named | None = None
) -> torch.Tensor:
    """The module's trainable parameters (``named``, default: read from ``module``) as one
    detached vector (w of eq. 2)."""
    named = list(module.named_parameters()) if named is None else named
    return torch.cat([p.detach().reshape(-1).to(dtype) for _, p in named])


def unflatten_parameters(
    module: nn.Module, flat: torch.Tensor, named: Named | None = None
) -> dict[str, torch.Tensor]:
    """Split a flat vector back into ``{name: tensor}`` shaped like the module's parameters
    (``named``, default: read from ``module``), for ``torch.func.functional_call``."""
    named = list(module.named_parameters()) if named is None else named
    sizes = [p.numel() for _, p in named]
    pieces = torch.split(flat, sizes)
    return {name: piece.reshape(p.shape) for (name, p), piece in zip(named, pieces, strict=True)}


def set_gradient(
    module: nn.Module, flat_gradient: torch.Tensor, named: Named | None = None
) -> None:
    """Write a flat gradient estimate into the ``.grad`` of the module's parameters (``named``,
    default: read from ``module``)."""
    named = list(module.named_parameters()) if named is None else named
    pieces = unflatten_parameters(module, flat_gradient, named)
    for name, p in named:
        p.grad = pieces[name].to(p.dtype)


@dataclass(frozen=True)
class ZooSettings:
    """What a ZOO query asks of a client (eq. 2): ``num_directions`` directions of kind
    ``direction``, smoothing ``mu``, perturbing its parameters (``space='params'``) or its output
    (``'output'``)."""

    num_directions: int
    mu: float
    direction: str
    space: str


@dataclass
class ZooQuery:
    """Client m's query: c and the q perturbed outputs c_hat_k (float64), the directions u_k it
    keeps to itself, and (``zoo_space='output'``) its float32 output with the autograd graph."""

    embedding: torch.Tensor
    perturbed: torch.Tensor
    directions: torch.Tensor
    output: torch.Tensor | None
    parameters: Named | None = None
    """The client's ``named_parameters()`` the query perturbed (``zoo_space='params'``): its
    estimate is written into their gradients."""


def stacked_parameters(
    module: nn.Module, flat_weights: torch.Tensor, named: Named | None = None
) -> dict[str, torch.Tensor]:
    """Split K flat vectors (K, d) into ``{name: (K, *shape)}`` like the module's parameters
    (``named``, default: read from ``module``)."""
    named = list(module.named_parameters()) if named is None else named
    pieces = torch.split(flat_weights, [p.numel() for _, p in named], dim=1)
    return {
        name: piece.reshape(len(flat_weights), *p.shape)
        for (name, p), piece in zip(named, pieces, strict=True)
    }


def perturbed_outputs(
    model: nn.Module, flat_weights: torch.Tensor, x: torch.Tensor, named: Named | None = None
) -> torch.Tensor:
    """``model`` evaluated in float64 at each row of ``flat_weights``, shape (K, B, ...)
    (``named``: the model's named parameters, default: read from it).

    Fully connected models (:func:`~vfl_lightning.models.batched.linear_chain`) run as one batched
    matrix product per layer over the K parameter sets; any other model through
    ``torch.func.vmap`` of ``functional_call``.
    """
    x64 = x.double()
    chain = linear_chain(model)
    if chain is not None:
        return chain_forward(chain, stacked_parameters(model, flat_weights, named), x64)

    def evaluate(w, buffers):
        pieces = unflatten_parameters(model, w, named)
        return functional_call(model, {**buffers, **pieces}, (x64,))

    # each parameter set gets its own float64 copy of the buffers (batch-norm statistics), which
    # the vmapped forward may update in place; the model's own buffers stay as they are
    buffers = {
        name: b.detach()
        .to(torch.float64 if b.is_floating_point() else b.dtype)
        .expand(len(flat_weights), *b.shape)
        .clone()
        for name, b in model.named_buffers()
    }
    return torch.func.vmap(evaluate)(flat_weights, buffers)


def evaluate_at(
    model: nn.Module, parameters: dict[str, torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """``model(x)`` with ``parameters`` (by name) in place of its own: ``functional_call``, or the
    same computation without its module traversal for fully connected models. The model's
    buffers (batch-norm statistics) enter as copies in ``x``'s dtype, so an evaluation never
    changes the model's state."""
    chain = linear_chain(model)
    if chain is not None:
        return chain_forward(chain, parameters, x)
    buffers = {
        name: b.detach().to(x.dtype) if b.is_floating_point() else b.detach().clone()
        for name, b in model.named_buffers()
    }
    return functional_call(model, {**buffers, **parameters}, (x,))


def double_parameters(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and floating-point buffers (batch-norm running statistics) as
    detached float64 copies, by name: a query evaluated with them leaves the module's own
    buffers untouched."""
    tensors = dict(module.named_parameters())
    tensors |= {name: b for name, b in module.named_buffers() if b.is_floating_point()}
    return {name: t.detach().double() for name, t in tensors.items()}


def evaluation_parameters(module: nn.Module) -> dict[str, torch.Tensor]:
    """What :func:`evaluate_at` needs of ``module`` at float64: for a fully connected model its
    linear layers' parameters, read from the layers (no walk over the module's submodules);
    otherwise :func:`double_parameters`."""
    chain = linear_chain(module)
    if chain is None:
        return double_parameters(module)
    tensors = {}
    for prefix, layer in chain:
        if isinstance(layer, nn.Linear):
            tensors[f"{prefix}weight"] = layer.weight.detach().double()
            if layer.bias is not None:
                tensors[f"{prefix}bias"] = layer.bias.detach().double()
    return tensors


def batch_losses(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Batch-mean cross-entropy of each of K stacked logit batches (K, B, C) -> (K,)."""
    k, b = logits.shape[:2]
    per_sample = F.cross_entropy(logits.reshape(k * b, -1), y.repeat(k), reduction="none")
    return per_sample.reshape(k, b).mean(1)


def client_query(
    model: nn.Module, x: torch.Tensor, settings: ZooSettings, generator: torch.Generator
) -> ZooQuery:
    """A client's query: c = F_m(w_m; x) and c_hat_k = F_m(w_m + mu u_k; x) (eq. 2,
    ``space='params'``) or c_hat_k = c + mu u_k (``'output'``), directions from ``generator``."""
    q = settings.num_directions
    if settings.space == "params":
        named = list(model.named_parameters())
        w = flat_parameters(model, named=named)
        u = sample_directions(q, w.shape, direction=settings.direction, generator=generator)
        with torch.no_grad():
            weights = torch.cat([w[None], w + settings.mu * u])
            outputs = perturbed_outputs(model, weights, x, named)
        return ZooQuery(outputs[0], outputs[1:], u, None, named)
    output = model(x)
    c = output.detach().double()
    u = sample_directions(q, c.shape, direction=settings.direction, generator=generator)
    return ZooQuery(c, c + settings.mu * u, u, output)


def client_estimate(query: ZooQuery, losses: torch.Tensor, settings: ZooSettings) -> torch.Tensor:
    """The client's eq. 3 estimate from the returned losses [h, h_hat_1..h_hat_q]: a flat
    parameter gradient (``space='params'``) or dL/dc for its local backprop (``'output'``)."""
    estimate = two_point_estimate(
        losses[0], losses[1:], query.directions, mu=settings.mu, direction=settings.direction
    )
    return estimate if query.output is None else estimate.to(query.output.dtype)
