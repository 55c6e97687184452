"""Exact acceptance of the ratio test and of Gumbel-coupled matching, against simulation and known bounds."""

import torch

from evals.acceptance import coupled_acceptance, ratio_acceptance


def test_coupled_acceptance_matches_simulation_and_lies_within_its_bounds():
    torch.manual_seed(0)
    p, q = torch.softmax(torch.randn(3, 6), -1), torch.softmax(torch.randn(3, 6), -1)
    exact = coupled_acceptance(p, q)
    draws = 40000
    g = -torch.log(-torch.log(torch.rand(draws, 3, 6).clamp(1e-12, 1 - 1e-7)))
    simulated = ((p.log() + g).argmax(-1) == (q.log() + g).argmax(-1)).float().mean(0)
    assert torch.allclose(exact, simulated, atol=0.01)
    tv = 1 - ratio_acceptance(p, q)
    assert bool(((1 - tv) / (1 + tv) <= exact + 1e-6).all() and (exact <= 1 - tv + 1e-6).all())


def test_equal_distributions_always_agree_and_disjoint_ones_never():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    assert torch.allclose(coupled_acceptance(p, p), torch.ones(1)) and torch.allclose(ratio_acceptance(p, p),
                                                                                      torch.ones(1))
    q = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    assert coupled_acceptance(p, q).item() == 0 and ratio_acceptance(p, q).item() == 0
