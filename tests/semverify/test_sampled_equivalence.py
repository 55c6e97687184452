"""Sampled speculative decoding through the whole loop reproduces the target's own distribution.

The first two new tokens of a tiny model (vocabulary 8) have 64 possible outcomes whose exact
probabilities come from the target's forward passes (three tokens, 512 outcomes, for trees two
levels deep); thousands of seeded runs must fit them (chi-square), and a rule that accepts every draft
must not.
"""

import pytest
import torch
from scipy.stats import chisquare

from semverify import ModelDrafter, ModelTreeDrafter, PromptLookupDrafter, Sampler, SpeculativeSampling, Verdict
from semverify.engine.loop import speculative_generate
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


class FirstChildAlways(SpeculativeSampling):
    """Deliberately broken for trees: keeps the first child of the root whatever the target says."""

    def verify_tree(self, x):
        first = int((x.draft.parents == -1).nonzero()[0])
        bonus = torch.multinomial(x.target_probs[0, first + 1], 1, generator=x.generator)
        return [first], Verdict(torch.ones(1, dtype=torch.long), bonus, {"ratio": torch.ones(1, 1, dtype=torch.bool)})


def exact_distribution(model, sampler, tokens: int = 2) -> torch.Tensor:
    """P(t1, ..., t_tokens | PROMPT) under the warped target, as a [V**tokens] vector (t1 most significant)."""
    with torch.inference_mode():
        joint = sampler.probs(model(PROMPT).logits[0, -1])
        for depth in range(1, tokens):
            prefixes = torch.cartesian_prod(*[torch.arange(V)] * depth).reshape(-1, depth)
            nxt = sampler.probs(model(torch.cat([PROMPT.repeat(len(prefixes), 1), prefixes], dim=1)).logits[:, -1])
            joint = (joint[:, None] * nxt).flatten()
    return joint


def fits(model, drafter_factory, rule, sampler, k, tokens: int = 2, runs: int = RUNS) -> float:
    """Chi-square p-value of ``runs`` sampled continuations of ``tokens`` tokens against the exact distribution."""
    expected = exact_distribution(model, sampler, tokens) * runs
    counts = torch.zeros(V**tokens)
    g = torch.Generator().manual_seed(0)
    for _ in range(runs):
        out, _ = speculative_generate(model, PROMPT, drafter=drafter_factory(), rule=rule, k=k,
                                      max_new_tokens=tokens, sampler=sampler, generator=g)
        counts[sum(int(t) * V**i for i, t in enumerate(out[0, -tokens:].flip(0)))] += 1
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


def test_draft_model_trees_sampled_sibling_by_sibling_match_target_distribution(models):
    target, draft = models
    trees = lambda: ModelTreeDrafter(draft, budget=9, branch=3, threshold=1.0)  # noqa: E731  (always 3 children)
    assert fits(target, trees, SpeculativeSampling(), Sampler(True, 1.0), k=2, tokens=3) > 1e-3
    assert fits(target, trees, FirstChildAlways(), Sampler(True, 1.0), k=2, tokens=3, runs=1000) < 1e-6
