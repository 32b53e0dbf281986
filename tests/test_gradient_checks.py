"""A party's check of the gradients it receives (:func:`checked_gradients`) when several parties
are checked together: gradients measured in one stacked computation are still each measured over
their own values, and each refusal or clip goes to the party whose gradient it is."""

from __future__ import annotations

import pytest
import torch

from vfl_lightning.algorithms.gradient_checks import (
    checked_gradients,
    largest_row_norms,
    row_norms,
)
from vfl_lightning.algorithms.party_budget import PartyBudget
from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.algorithms.party_rules import PartyGuard
from vfl_lightning.errors import PartyRefusal

ROWS, WIDTH, PARTIES = 8, 5, 4


def guards(**policy) -> list[PartyGuard]:
    return [PartyGuard(m, budget=PartyBudget(m, PartyPolicy(**policy))) for m in range(PARTIES)]


def embeddings() -> list[torch.Tensor]:
    return [torch.zeros(ROWS, WIDTH) for _ in range(PARTIES)]


def split_gradient() -> list[torch.Tensor]:
    """Views of one (rows, parties x width) gradient, one per party, as a concatenation's
    gradient is split (same shape, distinct memory, strided)."""
    torch.manual_seed(0)
    return list(torch.randn(ROWS, PARTIES * WIDTH).split(WIDTH, dim=1))


def test_each_gradient_is_measured_over_its_own_rows():
    gradients = split_gradient()
    gradients[2][3] *= 100.0
    expected = [row_norms(g).amax().item() for g in gradients]
    measured = largest_row_norms(gradients)
    assert measured == pytest.approx(expected, rel=1e-6)
    assert max(range(PARTIES), key=measured.__getitem__) == 2
    # a mix of shapes is measured gradient by gradient, the same values
    mixed = [*gradients[:2], torch.randn(3, 2), gradients[0]]
    assert largest_row_norms(mixed) == pytest.approx(
        [row_norms(g).amax().item() for g in mixed], rel=1e-6
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_value_in_one_view_is_refused_by_its_own_party(bad):
    gradients = split_gradient()
    gradients[3][ROWS - 1, WIDTH - 1] = bad  # the last value of the shared storage
    with pytest.raises(PartyRefusal, match="^party 3 refused apply_gradient: .* must be finite"):
        checked_gradients(guards(), gradients, embeddings())
    gradients = split_gradient()
    gradients[1][0, 0] = bad
    with pytest.raises(PartyRefusal, match="^party 1 refused apply_gradient: .* must be finite"):
        checked_gradients(guards(), gradients, embeddings())


def test_an_oversized_row_is_refused_or_clipped_for_its_own_party_only():
    gradients = split_gradient()
    gradients[2][4] = 50.0  # row 4 of party 2: norm 50 * sqrt(5)
    norm = 50.0 * WIDTH**0.5
    with pytest.raises(PartyRefusal, match=f"^party 2 refused apply_gradient: .* norm {norm:.4g}"):
        checked_gradients(guards(max_gradient_norm=10.0), gradients, embeddings())
    out = checked_gradients(
        guards(max_gradient_norm=10.0, large_gradient="clip"), gradients, embeddings()
    )
    clipped = gradients[2].clone()
    clipped[4] *= 10.0 / clipped[4].norm()
    assert torch.allclose(out[2], clipped, rtol=1e-6, atol=0)
    assert all(out[m] is gradients[m] for m in (0, 1, 3))  # within the bound: untouched
    assert row_norms(out[2]).amax().item() == pytest.approx(10.0, rel=1e-6)


def test_a_zoo_answer_is_one_row_of_losses():
    """A ZOO client's answer (1 + q float64 losses) is one row: its norm is measured over all of
    it, refused when non-finite or, under a bound, refused or clipped as a whole."""
    losses = torch.tensor([3.0, 4.0], dtype=torch.float64)
    expected = [torch.empty(2, dtype=torch.float64)]
    with pytest.raises(PartyRefusal, match="^party 0 refused answer: .* norm 5, above"):
        checked_gradients(guards(max_gradient_norm=1.0)[:1], [losses], expected, "answer")
    clip = guards(max_gradient_norm=1.0, large_gradient="clip")[:1]
    (out,) = checked_gradients(clip, [losses], expected, "answer")
    assert torch.allclose(out, losses / 5.0)
    (out,) = checked_gradients(guards(max_gradient_norm=5.5)[:1], [losses], expected, "answer")
    assert out is losses
    bad = losses.clone()
    bad[1] = float("nan")
    with pytest.raises(PartyRefusal, match="^party 0 refused answer: .* must be finite"):
        checked_gradients(guards()[:1], [bad], expected, "answer")
