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


def test_typical_acceptance_of_both_forms_matches_simulation():
    """Medusa's form keeps x ~ q when p(x) clears the bound or x is p's argmax; the coupled form when p(x)
    clears it or x is p's Gumbel-max token under the same noise. Exact values against draws."""
    from evals.acceptance import typical_acceptance
    from semverify.rules import TypicalAcceptance, entropy

    torch.manual_seed(1)
    p, q = torch.softmax(2 * torch.randn(4, 7), -1), torch.softmax(2 * torch.randn(4, 7), -1)
    rule = TypicalAcceptance(posterior_threshold=0.2, posterior_alpha=0.5)
    bound = torch.clamp(rule.posterior_alpha * torch.exp(-entropy(p)), max=rule.posterior_threshold)
    g = -torch.log(-torch.log(torch.rand(40000, 4, 7).clamp(1e-12, 1 - 1e-7)))
    x, y = (q.log() + g).argmax(-1), (p.log() + g).argmax(-1)
    clears = p.gather(-1, x.T).T > bound
    paper = (clears | (x == p.argmax(-1))).float().mean(0)
    coupled = (clears | (x == y)).float().mean(0)
    assert torch.allclose(typical_acceptance(p, q, rule, coupled=False), paper, atol=0.01)
    assert torch.allclose(typical_acceptance(p, q, rule, coupled=True), coupled, atol=0.01)
    assert not torch.allclose(paper, coupled, atol=0.02)  # the two forms differ here


def test_expected_tau_counts_the_bonus_token():
    from evals.acceptance import expected_tau

    assert expected_tau([0.0, 0.0], 5) == 1.0
    assert abs(expected_tau([1.0], 5) - 6.0) < 1e-6
    assert abs(expected_tau([0.5], 2) - 1.75) < 1e-9
