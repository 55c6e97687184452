"""Coupled sampling: the Gumbel-max noise draws the warped distribution, lossless methods reproduce the
target alone token for token whatever the drafter, and lossy rules at their lossless limit do too."""

import math

import pytest
import torch
from scipy.stats import chisquare

from semverify import (
    HybridDrafter,
    ModelDrafter,
    ModelTreeDrafter,
    NoDrafter,
    PromptLookupDrafter,
    Sampler,
    SpeculativeSampling,
    generate,
    get_rule,
)
from semverify.engine.coupling import CoupledNoise, counter_gumbel, mix
from semverify.engine.loop import speculative_generate
from semverify.rules import at_position, prefix_mask, target_choices
from semverify.types import Verdict
from tests.helpers import tiny_model
from tests.semverify.test_sampled_equivalence import exact_distribution

V = 8
PROMPT = torch.tensor([[1, 2, 3, 1, 2]])
SAMPLERS = [Sampler(True, 1.0), Sampler(True, 0.7, top_k=5, top_p=0.9)]


class AcceptEverything(SpeculativeSampling):
    """Deliberately broken: keeps every draft token, then the coupled target token (output follows the drafter)."""

    _coupling = "own-draft"  # it decides by itself; coupled runs draw its drafts apart

    def __call__(self, x):
        n = torch.full((1,), x.k, dtype=torch.long)
        return Verdict(n, at_position(target_choices(x), n), {"exact": prefix_mask(n, x.k)})


@pytest.fixture(scope="module")
def models():
    return tiny_model(0, vocab=V, init_std=0.5), tiny_model(1, vocab=V, init_std=0.5)


@pytest.fixture(scope="module")
def wide():
    """A pair with a wider vocabulary, for long outputs where drafts are sometimes right."""
    return tiny_model(0, vocab=64, init_std=0.3), tiny_model(0, vocab=64, init_std=0.3, layers=1)


def pvalue(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Chi-square p-value of ``counts`` against ``expected`` (outcomes expected < 5 times pooled); 0 when an
    outcome of probability 0 was drawn."""
    if counts[expected == 0].sum() > 0:
        return 0.0
    big, rare = expected >= 5, (expected > 0) & (expected < 5)
    obs, exp = counts[big], expected[big]
    if rare.any():
        obs, exp = torch.cat([obs, counts[rare].sum()[None]]), torch.cat([exp, expected[rare].sum()[None]])
    return chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue


def test_noise_is_a_function_of_seed_sample_and_position():
    a, b = CoupledNoise(3), CoupledNoise(3)
    assert torch.equal(a.gumbel(5, 100), b.at(2).gumbel(3, 100))
    assert not torch.equal(a.gumbel(5, 100), a.gumbel(6, 100))
    assert not torch.equal(a.gumbel(5, 100), CoupledNoise(3, sample=1).gumbel(5, 100))
    assert not torch.equal(a.gumbel(5, 100), a.gumbel(5, 100, stream=1))
    assert mix(1, 2) == mix(1, 2) != mix(2, 1)
    with pytest.raises(ValueError, match="position"):
        a.choose(torch.zeros(100))


def test_context_keys_follow_the_last_tokens_and_never_repeat_within_an_output():
    """Keyed by context, a draw's noise depends on the last n tokens and on how often they occurred before
    in the output, not on the position: two outputs that differ earlier draw the same noise again once
    their last tokens agree, while one output never draws the same key twice."""
    noise = CoupledNoise(3, context=2)
    prompt = [9, 8, 7]
    # the same last two tokens (5, 6), seen once before neither's position: the same noise at any position
    a = noise.at(3, prompt + [1, 5, 6]).gumbel(0, 50)
    b = CoupledNoise(3, context=2).at(4, prompt + [2, 3, 5, 6]).gumbel(0, 50)
    assert torch.equal(a, b)
    # a second occurrence of the context in the output gets fresh noise
    again = CoupledNoise(3, context=2).at(5, prompt + [5, 6, 1, 5, 6]).gumbel(0, 50)
    assert not torch.equal(a, again)
    # draws inside a step read the step's earlier tokens: position 2 after (5, 6) is keyed like the above
    step = CoupledNoise(3, context=2).at(1, prompt + [1])
    assert torch.equal(step.gumbel(2, 50, tokens=[5, 6]), a)
    assert not torch.equal(step.gumbel(2, 50, tokens=[5, 7]), a)
    # and a context that occurs twice within one step is keyed by its earlier occurrence there as well
    assert torch.equal(CoupledNoise(3, context=2).at(0, prompt).gumbel(5, 50, tokens=[5, 6, 1, 5, 6]), again)
    with pytest.raises(ValueError, match="needs the 2 tokens"):
        step.gumbel(2, 50, tokens=[5])
    with pytest.raises(ValueError, match="sequence"):
        CoupledNoise(3, context=2).at(1)
    # a new generation with the same noise counts its own contexts from scratch
    reused = CoupledNoise(3, context=2)
    reused.at(5, prompt + [5, 6, 1, 5, 6])
    assert torch.equal(reused.at(3, prompt + [1, 5, 6]).gumbel(0, 50), a)


def test_gumbel_max_draws_the_softmax_and_a_wrong_noise_is_detected():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")])
    runs = 6000
    counts = torch.zeros(6)
    wrong = torch.zeros(6)
    for seed in range(runs):
        noise = CoupledNoise(seed)
        counts[noise.choose(logits[None], [0])] += 1
        wrong[(logits + torch.rand(6, generator=noise.generator())).argmax()] += 1  # uniform noise: biased
    expected = logits.softmax(-1) * runs
    assert pvalue(counts, expected) > 1e-3
    assert pvalue(wrong, expected) < 1e-6


def joint_counts(model, drafter_factory, rule, sampler, tokens: int, runs: int, context=None) -> torch.Tensor:
    counts = torch.zeros(V**tokens)
    for seed in range(runs):
        out, _ = speculative_generate(model, PROMPT, drafter=drafter_factory(), rule=rule, k=2,
                                      max_new_tokens=tokens, sampler=sampler,
                                      generator=CoupledNoise(seed, context=context))
        counts[sum(int(t) * V**i for i, t in enumerate(out[0, -tokens:].flip(0)))] += 1
    return counts


KEYINGS = [None, 2]  # noise keyed by position, or by the last two tokens


@pytest.mark.parametrize("context", [None, 1])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_coupled_vanilla_and_coupled_sd_keep_the_target_distribution(models, sampler, context):
    target, draft = models
    expected = exact_distribution(target, sampler) * 3000
    for factory in (NoDrafter, lambda: ModelDrafter(draft)):
        assert pvalue(joint_counts(target, factory, SpeculativeSampling(), sampler, 2, 3000, context), expected) > 1e-3
    broken = joint_counts(target, lambda: ModelDrafter(draft), AcceptEverything(), sampler, 2, 3000, context)
    assert pvalue(broken, expected) < 1e-6


WARM = Sampler(True, 0.8)


def coupled(model, drafter, rule="speculative", seed=0, tokens=40, sampler=WARM, ids=PROMPT, context=None):
    out, stats = speculative_generate(model, ids, drafter=drafter, rule=get_rule(rule) if isinstance(rule, str)
                                      else rule, k=4, max_new_tokens=tokens, sampler=sampler,
                                      generator=CoupledNoise(seed, context=context))
    return out, stats


@pytest.mark.parametrize("context", KEYINGS)
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_drafter_gives_the_target_alone_token_for_token(wide, sampler, context):
    target, draft = wide
    drafters = {"draft model": lambda: ModelDrafter(draft), "prompt lookup": lambda: PromptLookupDrafter(2),
                "draft tree": lambda: ModelTreeDrafter(draft, budget=8, branch=2, threshold=1.0),
                "hybrid": lambda: HybridDrafter(ModelDrafter(draft), PromptLookupDrafter(2))}
    accepted = dict.fromkeys(drafters, 0)
    for seed in range(8):
        expected, _ = coupled(target, NoDrafter(), seed=seed, sampler=sampler, context=context)
        for name, factory in drafters.items():
            out, stats = coupled(target, factory(), seed=seed, sampler=sampler, context=context)
            assert torch.equal(out, expected), f"{name}, seed {seed}"
            accepted[name] += stats.accepted
    assert all(accepted.values()), accepted  # drafts were kept, so the identity is not vacuous


BATCH_DRAFTERS = {"draft model": lambda draft: dict(assistant_model=draft),
                  "draft tree": lambda draft: dict(drafter=ModelTreeDrafter(draft, budget=8, branch=2, threshold=1.0)),
                  "hybrid": lambda draft: dict(drafter=HybridDrafter(ModelDrafter(draft), PromptLookupDrafter(2)))}


@pytest.mark.parametrize("context", KEYINGS)
@pytest.mark.parametrize("drafting", list(BATCH_DRAFTERS))
def test_coupled_batch_rows_equal_their_rows_alone(wide, drafting, context):
    target, draft = wide
    ids = torch.tensor([[0, 5, 9, 4, 7], [3, 1, 4, 1, 5]])
    noises = [CoupledNoise(11, context=context), CoupledNoise(12, context=context)]
    out = generate(target, ids, do_sample=True, temperature=0.8, top_k=0, max_new_tokens=20, generator=noises,
                   attention_mask=torch.ones_like(ids), **BATCH_DRAFTERS[drafting](draft))
    for row in range(2):
        alone, _ = coupled(target, NoDrafter(), seed=11 + row, tokens=20, ids=ids[row : row + 1], context=context)
        assert torch.equal(out[row, : alone.shape[1]], alone[0])


LOSSLESS_LIMITS = {  # (typical's limit, argmax matching, is lossless under greedy decoding only: sampled, Medusa's
    # rule keeps the target's argmax whatever the draw)
    "sense": {"theta_e": 1.0},
    "fly": {"window": 0},
    "easd": {"draft_entropy": math.inf, "target_entropy": math.inf},
}


@pytest.mark.parametrize("context", KEYINGS)
@pytest.mark.parametrize("name", sorted(LOSSLESS_LIMITS))
def test_lossy_rules_at_their_lossless_limit_equal_coupled_vanilla(wide, name, context):
    target, draft = wide
    for seed in range(3):
        expected, _ = coupled(target, NoDrafter(), seed=seed, context=context)
        out, stats = coupled(target, ModelDrafter(draft), rule=get_rule(name, **LOSSLESS_LIMITS[name]), seed=seed,
                             context=context)
        assert torch.equal(out, expected), f"seed {seed}"


def test_a_lossy_rule_differs_from_coupled_vanilla_only_after_it_decides_otherwise(wide):
    target, draft = wide
    rule = get_rule("easd", draft_entropy=0.0, target_entropy=0.0, overlap=0.2)
    expected, _ = coupled(target, NoDrafter(), tokens=60)
    out, stats = coupled(target, ModelDrafter(draft), rule=rule, tokens=60)
    assert "penalty" in stats.reasons  # the penalty is everywhere here: the emitted law is the penalised one
    differs = (out[0] != expected[0]).nonzero()
    assert len(differs), "the penalty changed no token"


def test_legacy_noise_is_the_committed_runs_noise_and_counter_noise_is_keyed_the_same_way():
    """``noise="legacy"`` draws exactly what the committed coupled runs drew (a CPU generator seeded by the key,
    float64 uniforms); ``"counter"`` expands the same key on the device by hashing, the same for any batch."""
    legacy = CoupledNoise(7, noise="legacy").at(3)
    g = torch.Generator().manual_seed(mix(7, 0, 0, 5, 50))  # (seed, sample, stream, absolute position, vocab)
    u = torch.rand(50, generator=g, dtype=torch.float64).clamp_(1e-300, 1.0 - 1e-16)
    assert torch.equal(legacy.gumbel(2, 50), (-torch.log(-torch.log(u))).float())
    counter = CoupledNoise(7).at(3)
    assert torch.equal(counter.gumbel(2, 50), counter_gumbel([mix(7, 0, 0, 5, 50)], 50)[0])
    together = counter.noise_at([0, 1, 2], 50)
    assert torch.equal(together[2], counter.gumbel(2, 50)) and not torch.equal(together[0], together[1])
    assert not torch.equal(counter.gumbel(2, 50), legacy.gumbel(2, 50))
    with pytest.raises(ValueError, match="noise must be one of"):
        CoupledNoise(1, noise="philox")


def test_counter_noise_is_gumbel_distributed_bounded_and_uncorrelated_across_keys():
    from scipy.stats import kstest

    noise = counter_gumbel(list(range(64)), 4096)
    assert bool(torch.isfinite(noise).all()) and float(noise.min()) > -3.0 and float(noise.max()) < 17.5
    assert kstest(noise.flatten()[:200_000].double().numpy(), "gumbel_r").pvalue > 1e-3
    assert abs(float(torch.corrcoef(noise[:2])[0, 1])) < 0.05  # neighbouring keys
    assert abs(float(torch.corrcoef(torch.stack([noise[0, :-1], noise[0, 1:]]))[0, 1])) < 0.05  # neighbouring tokens


@pytest.mark.parametrize("noise", ["counter", "legacy"])
def test_both_noises_draw_the_softmax(noise):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")])
    counts = torch.zeros(6)
    for seed in range(4000):
        counts[CoupledNoise(seed, noise=noise).choose(logits[None], [0])] += 1
    assert pvalue(counts, logits.softmax(-1) * 4000) > 1e-3
