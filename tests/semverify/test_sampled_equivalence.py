"""Sampled speculative decoding through the whole loop reproduces the target's own distribution.

The first two new tokens of a tiny model (vocabulary 8) have 64 possible outcomes whose exact
probabilities come from the target's forward passes; thousands of seeded runs must fit them
(chi-square), and a rule that accepts every draft must not.
"""

import pytest
import torch
from scipy.stats import chisquare

from semverify import ModelDrafter, PromptLookupDrafter, Sampler, SpeculativeSampling, Verdict
from semverify.loop import speculative_generate
from semverify.rules import prefix_mask
from tests.helpers import tiny_model

V, RUNS = 8, 4000
PROMPT = torch.tensor([[1, 2, 3, 1, 2]])


class AcceptEverything(SpeculativeSampling):
    """Deliberately broken: keeps every draft token (so the output follows the drafter)."""

    def __call__(self, x):
        n = torch.full((1,), x.k, dtype=torch.long)
        bonus = torch.multinomial(x.target_probs[:, -1], 1, generator=x.generator)[:, 0]
        return Verdict(n, bonus, {"ratio": prefix_mask(n, x.k)})


def exact_two_token_distribution(model, sampler) -> torch.Tensor:
    """P(t1, t2 | PROMPT) under the warped target, as a [V*V] vector."""
    with torch.inference_mode():
        p1 = sampler.probs(model(PROMPT).logits[0, -1])
        seqs = torch.cat([PROMPT.repeat(V, 1), torch.arange(V)[:, None]], dim=1)
        p2 = sampler.probs(model(seqs).logits[:, -1])
    return (p1[:, None] * p2).flatten()


def fits(model, drafter_factory, rule, sampler, k) -> float:
    """Chi-square p-value of RUNS sampled 2-token continuations against the exact distribution."""
    expected = exact_two_token_distribution(model, sampler) * RUNS
    counts = torch.zeros(V * V)
    g = torch.Generator().manual_seed(0)
    for _ in range(RUNS):
        out, _ = speculative_generate(model, PROMPT, drafter=drafter_factory(), rule=rule, num_draft_tokens=k,
                                      max_new_tokens=2, sampler=sampler, generator=g)
        counts[out[0, -2] * V + out[0, -1]] += 1
    assert counts[expected == 0].sum() == 0, "emitted an outcome the target gives probability 0"
    big, rare = expected >= 5, (expected > 0) & (expected < 5)  # pool the rare outcomes into one bin
    obs, exp = counts[big], expected[big]
    if rare.any():
        obs, exp = torch.cat([obs, counts[rare].sum()[None]]), torch.cat([exp, expected[rare].sum()[None]])
    obs, exp = obs.numpy(), exp.numpy()
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.fixture(scope="module")
def models():
    return tiny_model(0, vocab=V, init_std=0.5), tiny_model(1, vocab=V, init_std=0.5)


@pytest.mark.parametrize("sampler", [Sampler(True, 1.0), Sampler(True, 0.7, top_k=5, top_p=0.9)])
def test_model_drafter_matches_target_distribution(models, sampler):
    target, draft = models
    assert fits(target, lambda: ModelDrafter(draft), SpeculativeSampling(), sampler, k=2) > 1e-3


def test_deterministic_drafter_matches_target_distribution(models):
    target, _ = models
    assert fits(target, lambda: PromptLookupDrafter(1), SpeculativeSampling(), Sampler(True, 1.0), k=2) > 1e-3


def test_negative_control_broken_rule_is_detected(models):
    target, draft = models
    assert fits(target, lambda: ModelDrafter(draft), AcceptEverything(), Sampler(True, 1.0), k=2) < 1e-6
