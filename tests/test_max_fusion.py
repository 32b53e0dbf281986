"""Element-wise max fusion (FedVS Fig. 1) under the plain mechanism: the fused input, the
subgradient each party receives (equal to autograd's through the fusion), ties, and training."""

from __future__ import annotations

import pytest
import torch

from vfl_lightning.mechanisms import Plain, fuse_tensors, fused_width, join_own_embedding
from vfl_lightning.mechanisms.base import split_gradient


def test_max_fusion_is_the_elementwise_maximum():
    torch.manual_seed(0)
    parts = [torch.randn(5, 4) for _ in range(3)]
    assert torch.equal(fuse_tensors(parts, "max"), torch.stack(parts).amax(0))
    assert fused_width([4, 4, 4], "max") == 4


def test_plain_max_gradients_equal_autograd_through_the_fusion():
    """Party m gets dL/d(fused) where it holds the maximum and 0 elsewhere: exactly the gradient
    autograd computes for h_m through the fused maximum, for a loss that is not linear."""
    torch.manual_seed(1)
    parts = [torch.randn(6, 3, requires_grad=True) for _ in range(4)]
    mechanism = Plain(num_parties=4, fusion="max")
    fused = mechanism.fuse(mechanism.encode([p.detach() for p in parts])).requires_grad_()
    loss = (fused.sin() * torch.arange(3.0)).sum()
    loss.backward()
    sent = mechanism.party_gradients(fused.grad, [3] * 4)
    (fuse_tensors(parts, "max").sin() * torch.arange(3.0)).sum().backward()
    winners = torch.stack([p.detach() for p in parts]).argmax(0)
    for m, (part, gradient) in enumerate(zip(parts, sent, strict=True)):
        assert torch.equal(gradient, part.grad)
        assert torch.equal(gradient[winners != m], torch.zeros_like(gradient[winners != m]))
        assert torch.equal(gradient[winners == m], fused.grad[winners == m])
    total = torch.stack(sent).sum(0)
    assert torch.equal(total, fused.grad), "every element's gradient goes to exactly one party"


def test_max_fusion_ties_go_to_the_lowest_party():
    a = torch.tensor([[1.0, 2.0, 3.0]])
    b = torch.tensor([[1.0, 5.0, 3.0]])
    c = torch.tensor([[0.0, 5.0, 3.0]])
    mechanism = Plain(num_parties=3, fusion="max")
    assert torch.equal(mechanism.fuse([a, b, c]), torch.tensor([[1.0, 5.0, 3.0]]))
    grads = mechanism.party_gradients(torch.ones(1, 3), [3, 3, 3])
    assert [g.tolist() for g in grads] == [[[1, 0, 1]], [[0, 1, 0]], [[0, 0, 0]]]


def test_max_fusion_with_the_servers_own_embedding():
    fused = torch.tensor([[1.0, 4.0]], requires_grad=True)
    own = torch.tensor([[2.0, 4.0]], requires_grad=True)
    joined = join_own_embedding(fused, own, "max", num_senders=3)
    assert joined.tolist() == [[2.0, 4.0]]
    joined.sum().backward()
    assert fused.grad.tolist() == [[0.0, 1.0]] and own.grad.tolist() == [[1.0, 0.0]]


def test_max_gradient_split_needs_the_winners():
    with pytest.raises(ValueError, match="max fusion splits the gradient by the winners"):
        split_gradient(torch.ones(2, 2), "max", [2, 2])
