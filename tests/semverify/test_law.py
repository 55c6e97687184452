"""Coupling may correlate methods, never change one: every registered rule keeps its law in every mode.

Token rules state their law (`TokenLaw`); `semverify.testing.check_rule_law` checks, on small vocabularies and
random (p, q), that the closed-form emitted law is the token-by-token statement and that single calls emit it,
uncoupled and coupled (the draft drawn apart, and from the target's own noise); end to end, `check_generate_law`
checks the first token `generate` emits with a draft model drafting from the shared noise. Rules that decide by
themselves over a window are checked end to end, coupled against uncoupled. Where an engine's code imports
(transformers' ``_speculative_sampling``), the rule is checked against it, ties included.
"""

from __future__ import annotations

import math

import pytest
import torch

from semverify import get_rule
from semverify.engine.coupling import CoupledNoise, CoupledRows
from semverify.registry import available_rules
from semverify.testing import (
    check_coupled_like_uncoupled,
    check_generate_law,
    check_rule_law,
    chi_square_p,
    stated_law,
    two_sample_p,
)
from semverify.types import Draft, VerifyInput
from tests.helpers import tiny_model

# every registered token rule at a lossy setting (and its default), with the parameters the probe of issue 69 used
TOKEN_RULES = {
    "greedy": ("greedy", {}),
    "speculative": ("speculative", {}),
    "typical": ("typical", {}),
    "easd": ("easd", {"draft_entropy": 0.5, "target_entropy": 0.5, "top_n": 3, "overlap": 0.3}),
    "easd residual": ("easd", {"draft_entropy": 0.5, "target_entropy": 0.5, "top_n": 3, "overlap": 0.3,
                               "resample": "residual"}),
    "sense (no window)": ("sense", {"theta_e": 0.05, "top_k": 2, "window": 0}),
    "threshold": ("threshold", {"threshold_single": 0.5, "threshold_acc": 0.5}),
    "threshold (SGLang's defaults)": ("threshold", {}),
    "relaxed_topk": ("relaxed_topk", {"topk": 3, "delta": math.log(2), "space": "log"}),
    "relaxed_topk (TensorRT-LLM's)": ("relaxed_topk", {"topk": 10, "delta": 0.6}),
    "ensemble": ("ensemble", {"weight": 0.7}),
    "mars": ("mars", {"theta": 0.9}),
    "mars (low theta)": ("mars", {"theta": 0.3}),
}
# rules that look past one position decide by themselves (coupled drafts are drawn apart): checked end to end
WINDOW_RULES = {
    "fly": ("fly", {"entropy_threshold": 0.1, "window": 2}),
    "sense (window)": ("sense", {"theta_e": 0.05, "top_k": 2, "window": 2}),
}
# step rules judge whole reasoning steps from a step drafter and a tokenizer: their coupled drafts are drawn apart
# as the window rules' are (tests/semverify/semanticspec check their coupled runs)
STEP_RULES = {"semanticspec", "step_likelihood", "specreason"}


def build(name: str):
    rule, params = (TOKEN_RULES | WINDOW_RULES)[name]
    return get_rule(rule, **params)


def test_every_registered_rule_is_checked():
    covered = {rule for rule, _ in (TOKEN_RULES | WINDOW_RULES).values()} | STEP_RULES
    assert set(available_rules()) == covered


@pytest.mark.parametrize("name", sorted(TOKEN_RULES))
@pytest.mark.parametrize("deterministic", [False, True], ids=["model draft", "deterministic draft"])
def test_a_token_rule_emits_its_stated_law_in_every_mode(name, deterministic):
    rule = build(name)
    if deterministic and rule.needs_draft_probs:
        pytest.skip(f"{name} needs the draft's q")
    report = check_rule_law(rule, deterministic=deterministic, trials=4000, cases=3).raise_if_failed()
    coupled = [key for key in report.results if "coupled" in key and "pos" in key]
    assert coupled or name == "easd residual"  # coupled draws are checked wherever the law has a closed form


def test_a_broken_coupled_branch_fails_the_law_test():
    """The negative control: a rule that states EASD's law but draws coupled runs the old way (keep x while it
    equals the coupled target token, refuse where penalised) emits another law, and the check says so; uncoupled
    it is right."""
    from semverify.easd.rule import EntropyAwareRule
    from semverify.rules import at_position, leading_true, target_choices
    from semverify.types import Verdict

    class OldCoupledEASD(EntropyAwareRule):
        def __call__(self, x):
            if not isinstance(x.generator, CoupledRows):
                return super().__call__(x)
            choice = target_choices(x)
            p = x.target_probs[:, : x.k]
            keep = (x.draft.tokens == choice[:, : x.k]) & ~self.uncertain_agreement(x.draft.probs, p)
            n = leading_true(keep)
            return Verdict(n, at_position(choice, n))

    report = check_rule_law(OldCoupledEASD(0.5, 0.5, top_n=3, overlap=0.3), trials=4000, cases=3)
    assert not report.ok
    assert all("coupled" in line for line in report.failures)


def test_the_residual_form_of_easd_is_refused_coupled_with_one_line():
    rule = build("easd residual")
    x = VerifyInput(Draft(torch.tensor([[1, 2]]), torch.full((1, 2, 6), 1 / 6)), torch.randn(1, 3, 6), True,
                    generator=CoupledNoise(0))
    with pytest.raises(ValueError, match="no closed-form emitted law"):
        rule(x)


@pytest.mark.parametrize("name", ["speculative", "threshold (SGLang's defaults)", "relaxed_topk (TensorRT-LLM's)"])
def test_lossless_settings_state_p(name):
    rule = build(name)
    logits = torch.randn(1, 3, 6) * 2
    q = torch.softmax(torch.randn(1, 2, 6), -1)
    if name.startswith("relaxed_topk"):
        rule = get_rule("relaxed_topk", topk=1)
    law = stated_law(rule, logits, q, q.argmax(-1))
    assert torch.allclose(law, torch.softmax(logits[0, :2], -1), atol=1e-6)


# -- the engines' own code, where it imports ------------------------------------------------------------------------

def _transformers_speculative_sampling():
    utils = pytest.importorskip("transformers.generation.utils")
    if not hasattr(utils, "_speculative_sampling"):
        pytest.skip("this transformers has no _speculative_sampling")
    return utils._speculative_sampling


@pytest.mark.parametrize("weight", [0.3, 0.7, 1.0])
@pytest.mark.parametrize("ties", [False, True])
def test_ensemble_emits_what_transformers_speculative_sampling_emits(weight, ties):
    """transformers' own function, drawn many times at one position, against the rule's law and its draws."""
    import inspect

    speculative_sampling = _transformers_speculative_sampling()
    if weight < 1 and "assistant_ensemble_weight" not in inspect.signature(speculative_sampling).parameters:
        pytest.skip("this transformers has no assistant_ensemble_weight")
    vocab, trials = 5, 6000
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 2, vocab, generator=g)
    q_logits = torch.randn(1, 1, vocab, generator=g)
    if ties:  # two target tokens of equal probability, and the draft's q tied with p on one of them
        logits[..., 1] = logits[..., 0]
        q_logits[..., 0] = logits[0, 0, 0] - logits[0, 0].logsumexp(-1) + q_logits[0, 0].logsumexp(-1)
    q = torch.softmax(q_logits, -1)
    tokens = torch.multinomial(q[0, 0], trials, replacement=True, generator=g)
    torch.manual_seed(0)
    theirs = []
    for t in tokens.tolist():
        out, _ = speculative_sampling(torch.tensor([[0, t]]), q_logits, 1, logits, weight if weight < 1 else None)
        theirs.append(int(out[0, 0]))
    theirs = torch.bincount(torch.tensor(theirs), minlength=vocab)
    rule = get_rule("ensemble", weight=weight)
    law = stated_law(rule, logits, q, tokens[None, :1])[0]
    mixture = weight * torch.softmax(logits[0, 0], -1) + (1 - weight) * q[0, 0]
    assert torch.allclose(law, mixture, atol=1e-6)  # transformers' law: the mixture itself
    assert chi_square_p(theirs, law) > 1e-4
    x = VerifyInput(Draft(tokens[:, None], q.expand(trials, -1, -1)), logits.expand(trials, -1, -1), True,
                    generator=torch.Generator().manual_seed(1))
    verdict = rule(x)
    ours = torch.where(verdict.n_accepted > 0, tokens, verdict.next_token)
    assert two_sample_p(torch.bincount(ours, minlength=vocab), theirs) > 1e-4


# -- end to end through generate() -----------------------------------------------------------------------------------

V = 8
PROMPTS = [[1, 2, 3], [4, 5, 1, 6]]


@pytest.fixture(scope="module")
def pair():
    """A tiny target with spread-out logits and a noisy copy as its draft (vocabulary 8)."""
    target = tiny_model(11, vocab=V, init_std=0.5)
    draft = tiny_model(11, vocab=V, init_std=0.5)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.15 * torch.randn_like(param))
    return target, draft


@pytest.mark.parametrize("name", ["speculative", "easd", "threshold", "relaxed_topk", "ensemble", "mars", "typical",
                                  "sense (no window)"])
def test_generate_emits_each_rule_law_coupled_and_uncoupled(pair, name):
    check_generate_law(build(name), *pair, PROMPTS, rows=2500).raise_if_failed()


@pytest.mark.parametrize("name", sorted(WINDOW_RULES))
def test_window_rules_have_one_law_coupled_and_uncoupled(pair, name):
    check_coupled_like_uncoupled(build(name), *pair, PROMPTS, k=3, new_tokens=2, rows=1500).raise_if_failed()


def test_coupled_runs_refuse_a_rule_that_states_no_law_with_one_line(pair):
    from semverify import BaseRule, generate
    from semverify.rules import GreedyMatch

    class Mine(BaseRule):  # a plugin's rule with its own __call__ and nothing said about coupling
        name = "mine"

        def __call__(self, x):
            return GreedyMatch()(x)

    target, draft = pair
    ids = torch.tensor([PROMPTS[0]])
    with pytest.raises(ValueError, match="rule 'mine' cannot run with coupled noise: it states no law"):
        generate(target, ids, assistant_model=draft, rule=Mine(), do_sample=True, max_new_tokens=3,
                 generator=CoupledNoise(0))
    generate(target, ids, assistant_model=draft, rule=Mine(), do_sample=True, max_new_tokens=3,
             generator=torch.Generator().manual_seed(0))  # uncoupled it runs
