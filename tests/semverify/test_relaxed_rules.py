"""The relaxed acceptance rules serving engines ship (semverify.relaxed): each engine's definition on hand-built
tensors, the lossless limits token for token (hand-built, and end to end on tiny models, greedy and coupled,
batches of left-padded rows), batched rows, parameter checks, registration and presets."""

from __future__ import annotations

import math

import pytest
import torch

import semverify.engine.drawing as drawing
import semverify.rules as rules
from semverify import NoDrafter, Sampler, generate, get_rule
from semverify.engine.coupling import CoupledNoise
from semverify.engine.loop import speculative_generate
from semverify.engine.verification import verify_rows
from semverify.methods import Method, get_method, parse_method
from semverify.registry import RunContext, available_rules
from semverify.relaxed import EnsembleVerification, MarginAwareVerification, RelaxedTopK, ThresholdAcceptance
from semverify.rules import GreedyMatch, SpeculativeSampling
from semverify.types import Draft, Verdict, VerifyInput
from tests.helpers import check_verdict_bounds, tiny_model
from tests.semverify.test_batch import left_padded

V = 6


def make(tokens, probs_or_logits, q=None, do_sample=False, generator=None, logits=False) -> VerifyInput:
    """A VerifyInput from draft tokens [B, k] and target probabilities (or logits) [B, k+1, V]."""
    t = torch.as_tensor(probs_or_logits, dtype=torch.float)
    target = t if logits else torch.log(t)
    q = None if q is None else torch.as_tensor(q, dtype=torch.float)
    return VerifyInput(Draft(torch.as_tensor(tokens, dtype=torch.long), q), target, do_sample,
                       generator=generator if generator is not None else torch.Generator().manual_seed(0))


def fixed_uniform(monkeypatch, value: float) -> None:
    """Every uniform the engine draws for a rule is ``value`` (the engines' coins, made deterministic)."""
    def fake(shape, generator=None, device=None):
        return torch.full(shape, value)
    monkeypatch.setattr(drawing, "uniform", fake)


UNIFORM_ROW = [1 / V] * V


# -- SGLang: speculative_accept_threshold_single / _acc -----------------------------------------------------------
# sgl-kernel speculative_sampling.cuh, one child per depth (a chain): prob_acc = p(x), and x is accepted iff
#     coin <= prob_acc / threshold_acc  or  p(x) >= threshold_single
# a refused x is removed from p (draft_probs[x] = target_probs[x], residual relu(p - draft_probs)).

SGLANG_TABLE = [
    # threshold_single, threshold_acc, coin, kept?   (p(x) = 0.30)
    pytest.param(1.0, 1.0, 0.5, 0, id="defaults: 0.5 > 0.30"),
    pytest.param(1.0, 1.0, 0.2, 1, id="defaults: 0.2 <= 0.30"),
    pytest.param(1.0, 0.5, 0.5, 1, id="acc 0.5: 0.5 <= 0.60"),
    pytest.param(1.0, 0.7, 0.5, 0, id="acc 0.7: 0.5 > 0.43"),
    pytest.param(0.25, 1.0, 0.9, 1, id="single 0.25 <= 0.30"),
    pytest.param(0.35, 0.7, 0.5, 0, id="neither"),
]


@pytest.mark.parametrize("single,acc,coin,kept", SGLANG_TABLE)
def test_threshold_is_sglangs_target_only_test(monkeypatch, single, acc, coin, kept):
    fixed_uniform(monkeypatch, coin)
    p = [[[0.30, 0.70, 0, 0, 0, 0], UNIFORM_ROW]]
    v = ThresholdAcceptance(single, acc)(make([[0]], p, q=[[[1.0, 0, 0, 0, 0, 0]]], do_sample=True))
    assert v.n_accepted.tolist() == [kept]
    if not kept:  # the refused token leaves p: only token 1 is left (q plays no part)
        assert v.next_token.tolist() == [1]
    else:
        assert v.reasons["ratio"].tolist() == [[coin < 0.30]]


def test_threshold_leaves_greedy_decoding_to_argmax_matching():
    """SGLang verifies greedy requests by argmax matching (verify_tree_greedy): thresholds play no part."""
    p = [[[0.30, 0.70, 0, 0, 0, 0], UNIFORM_ROW]]
    v = ThresholdAcceptance(0.0, 0.01)(make([[0]], p))
    assert v.n_accepted.tolist() == [0] and v.next_token.tolist() == [1]


# -- TensorRT-LLM: relaxed_topk / relaxed_delta ------------------------------------------------------------------
# mtpRelaxedAcceptanceKernel: candidates = the top-relaxed_topk tokens of softmax(logits) whose probability is
#     >= top-1 probability - relaxed_delta;   a draft token is accepted iff it is a candidate; the top-1 follows.

TRT_P = [0.40, 0.35, 0.15, 0.05, 0.03, 0.02]
TRT_TABLE = [
    # topk, delta, space, draft token, kept?
    pytest.param(3, 0.1, "prob", 0, 1, id="top-1"),
    pytest.param(3, 0.1, "prob", 1, 1, id="0.35 >= 0.30"),
    pytest.param(3, 0.1, "prob", 2, 0, id="0.15 < 0.30"),
    pytest.param(3, 0.3, "prob", 2, 1, id="0.15 >= 0.10"),
    pytest.param(3, 1.0, "prob", 3, 0, id="rank 4 not in top-3"),
    pytest.param(4, 1.0, "prob", 3, 1, id="rank 4 in top-4"),
    pytest.param(1, 1.0, "prob", 1, 0, id="topk 1 is strict"),
    pytest.param(3, 0.0, "prob", 1, 0, id="delta 0 is strict"),
    pytest.param(3, math.log(2), "log", 1, 1, id="0.35 >= 0.40 / 2"),
    pytest.param(3, math.log(2), "log", 2, 0, id="0.15 < 0.40 / 2"),
]


@pytest.mark.parametrize("topk,delta,space,token,kept", TRT_TABLE)
def test_relaxed_topk_is_tensorrt_llms_candidate_set(topk, delta, space, token, kept):
    v = RelaxedTopK(topk, delta, space)(make([[token]], [[TRT_P, UNIFORM_ROW]]))
    assert v.n_accepted.tolist() == [kept]
    if not kept:
        assert v.next_token.tolist() == [0]  # the golden (top-1) token
    if kept and token:
        assert v.reasons["topk"].tolist() == [[True]] and v.target_tokens.tolist() == [[0]]  # logged as substituted


def test_relaxed_topk_stops_at_the_first_token_outside_the_set():
    v = RelaxedTopK(3, 0.1)(make([[1, 2]], [[TRT_P, TRT_P, UNIFORM_ROW]]))
    assert v.n_accepted.tolist() == [1] and v.next_token.tolist() == [0]


def test_relaxed_topk_never_keeps_a_token_the_target_cannot_emit():
    p = [[[0.9, 0.1, 0, 0, 0, 0], UNIFORM_ROW]]
    v = RelaxedTopK(6, 1.0)(make([[3]], p))
    assert v.n_accepted.tolist() == [0]


# -- transformers: assistant_ensemble_weight ---------------------------------------------------------------------
# sampling: accept iff r <= v(x)/q(x) = 1 - w + w p(x)/q(x); refusal: draw from (p - q)+ / sum.
# greedy: accept iff x == argmax(w p + (1 - w) q); that argmax follows a refusal, argmax(p) a full acceptance.

def test_ensemble_greedy_compares_with_the_mixtures_argmax():
    """transformers' own case: p = [.50, .49, .01], q = [.10, .89, .01], w = 0.5: v = [.30, .69, .01]."""
    p = [[[0.50, 0.49, 0.01, 0, 0, 0], UNIFORM_ROW]]
    q = [[[0.10, 0.89, 0.01, 0, 0, 0]]]
    assert EnsembleVerification(0.5)(make([[1]], p, q)).n_accepted.tolist() == [1]
    strict = EnsembleVerification(1.0)(make([[1]], p, q))
    assert strict.n_accepted.tolist() == [0] and strict.next_token.tolist() == [0]


def test_ensemble_greedy_emits_the_mixtures_argmax_after_a_refusal():
    p = [[[0.5, 0.3, 0.2, 0, 0, 0], UNIFORM_ROW]]
    q = [[[0.0, 0.2, 0.8, 0, 0, 0]]]  # v = [.25, .25, .50]: token 2, which is not the target's argmax
    v = EnsembleVerification(0.5)(make([[1]], p, q))
    assert v.n_accepted.tolist() == [0] and v.next_token.tolist() == [2]


@pytest.mark.parametrize("weight,kept", [(1.0, 0), (0.7, 1)])
def test_ensemble_sampling_is_transformers_ratio(monkeypatch, weight, kept):
    """transformers' test: q(x) = 0.80, p(x) = 0.40, r = 0.60: 0.50 < 0.60 refuses; 1 - 0.7 + 0.7 * 0.5 = 0.65."""
    fixed_uniform(monkeypatch, 0.60)
    p = [[[0.40, 0.30, 0.20, 0.10, 0, 0], UNIFORM_ROW]]
    q = [[[0.80, 0.10, 0.05, 0.05, 0, 0]]]
    assert EnsembleVerification(weight)(make([[0]], p, q, do_sample=True)).n_accepted.tolist() == [kept]


def test_ensemble_refusal_draws_from_the_residual(monkeypatch):
    fixed_uniform(monkeypatch, 0.99)
    p = [[[0.3, 0.7, 0, 0, 0, 0], UNIFORM_ROW]]
    q = [[[0.9, 0.1, 0, 0, 0, 0]]]  # (p - q)+ = [0, .6]: token 1 only
    for seed in range(5):
        v = EnsembleVerification(0.7)(make([[0]], p, q, do_sample=True, generator=torch.Generator().manual_seed(seed)))
        assert v.n_accepted.tolist() == [0] and v.next_token.tolist() == [1]


def test_ensemble_below_one_needs_the_draft_distribution():
    with pytest.raises(ValueError, match="draft distribution"):
        EnsembleVerification(0.5)(make([[0]], [[TRT_P, UNIFORM_ROW]]))
    assert EnsembleVerification(0.5).needs_draft_probs and not EnsembleVerification(1.0).needs_draft_probs


# -- MARS: the authors' evaluate_posterior (mars/model/utils.py) ----------------------------------------------------
# greedy: argmax matching; sampling: where z(2) / (z(1) + 1e-10) > theta keep x iff it is the top-1 or top-2 (no coin,
# a refusal draws from the whole p); elsewhere the ratio test, and a refusal draws from p without x.

MARS_TABLE = [
    # logits at position 0, theta, draft token, kept? (sampling, the coin at 0.99: the ratio test refuses)
    pytest.param([10, 9.5, 3, 1, 0, -1], 0.9, 1, 1, id="ratio 0.95 > 0.9"),
    pytest.param([10, 9.5, 3, 1, 0, -1], 0.9, 2, 0, id="top-3 never"),
    pytest.param([10, 8, 3, 1, 0, -1], 0.9, 1, 0, id="ratio 0.8: the ratio test"),
    pytest.param([10, 8, 3, 1, 0, -1], 0.75, 1, 1, id="ratio 0.8 > 0.75"),
    pytest.param([-1, -1.05, -3, -4, -5, -6], 0.9, 1, 1, id="a negative top logit relaxes, as theirs"),
    pytest.param([1e-12, -1, -3, -4, -5, -6], 0.9, 1, 0, id="z(1) > 0 > z(2): no relaxation"),
]


@pytest.mark.parametrize("z,theta,token,kept", MARS_TABLE)
def test_mars_is_the_authors_evaluate_posterior(monkeypatch, z, theta, token, kept):
    fixed_uniform(monkeypatch, 0.99)
    q = [[[0.0] * V]]
    q[0][0][token] = 1.0
    v = MarginAwareVerification(theta)(make([[token]], [[z, [0.0] * V]], q=q, do_sample=True, logits=True))
    assert v.n_accepted.tolist() == [kept]


def test_mars_relaxes_nothing_under_greedy_decoding():
    v = MarginAwareVerification(0.5)(make([[1]], [[[10, 9.9, 3, 1, 0, -1], [0.0] * V]], logits=True))
    assert v.n_accepted.tolist() == [0] and v.next_token.tolist() == [0]


def test_mars_refusals_draw_from_p_without_x_where_decided_and_from_p_where_undecided(monkeypatch):
    fixed_uniform(monkeypatch, 0.99)
    decided, undecided = [5.0, 1.0, 0.5, 0, 0, 0], [1.0, 0.95, 0.9, 0, 0, 0]
    for z, refused_can_repeat in ((decided, False), (undecided, True)):
        seen = set()
        for seed in range(300):
            drafted = 2 if z is decided else 3
            q = [[[float(t == drafted) for t in range(V)]]]
            x = make([[drafted]], [[z, [0.0] * V]], q=q, do_sample=True,
                     generator=torch.Generator().manual_seed(seed), logits=True)
            v = MarginAwareVerification(0.9)(x)
            assert v.n_accepted.tolist() == [0]
            seen.add(int(v.next_token))
        drafted = 2 if z is decided else 3
        assert (drafted in seen) == refused_can_repeat


# -- lossless limits on random tensors: token for token ----------------------------------------------------------

LIMITS = {
    "threshold defaults": lambda: ThresholdAcceptance(),
    "threshold single inf": lambda: ThresholdAcceptance(math.inf, 1.0),
    "relaxed_topk topk 1": lambda: RelaxedTopK(1, 1.0),
    "relaxed_topk delta 0": lambda: RelaxedTopK(5, 0.0),
    "relaxed_topk log delta 0": lambda: RelaxedTopK(5, 0.0, "log"),
    "ensemble weight 1": lambda: EnsembleVerification(1.0),
}
MODES = ["greedy", "coupled", "sampled"]


def random_input(mode: str, seed: int, B: int = 48, k: int = 4, vocab: int = 10, probs: bool = True) -> VerifyInput:
    """Random logits, drafts that often equal the target's own token (so accepted lengths vary), and a draft q
    whose argmax is the draft token (as a greedy drafter's)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, k + 1, vocab, generator=g) * 1.5
    generator = CoupledNoise(seed) if mode == "coupled" else torch.Generator().manual_seed(seed)
    own = CoupledNoise(seed).choose(logits) if mode == "coupled" else logits.argmax(-1)
    tokens = torch.where(torch.rand(B, k, generator=g) < 0.7, own[:, :k], torch.randint(0, vocab, (B, k), generator=g))
    q = torch.softmax(torch.randn(B, k, vocab, generator=g) + 8.0 * torch.nn.functional.one_hot(tokens, vocab), -1)
    return VerifyInput(Draft(tokens, q if probs else None), logits, mode != "greedy", generator=generator)


def same(a: Verdict, b: Verdict) -> None:
    assert torch.equal(a.n_accepted, b.n_accepted)
    assert torch.equal(a.next_token, b.next_token)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(LIMITS))
def test_each_rule_at_its_lossless_limit_is_speculative_sampling(name, mode):
    """Greedy and coupled: exact matching; sampled: the same draws as SpeculativeSampling (SGLang's test is
    target-only, so it is SpeculativeSampling with a one-hot proposal)."""
    probs = not (name.startswith("threshold") and mode == "sampled")
    for seed in range(3):
        rule_verdict = LIMITS[name]()(random_input(mode, seed, probs=probs))
        reference = SpeculativeSampling()(random_input(mode, seed, probs=probs))
        same(rule_verdict, reference)
        if mode != "sampled":
            same(rule_verdict, GreedyMatch()(random_input(mode, seed)))
    assert 0 < int(reference.n_accepted.sum()) < reference.n_accepted.numel() * 4  # lengths vary


LOSSY = {
    "threshold": lambda: ThresholdAcceptance(0.3, 0.5),
    "relaxed_topk": lambda: RelaxedTopK(3, 0.3),
    "ensemble": lambda: EnsembleVerification(0.5),
    "mars": lambda: MarginAwareVerification(0.3),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(LOSSY))
def test_lossy_settings_keep_more_and_report_it(name, mode):
    rule = LOSSY[name]()
    x = random_input(mode, 1)
    v = rule(x)
    n, _ = check_verdict_bounds(x, v)
    reference = SpeculativeSampling()(random_input(mode, 1))
    if name not in ("threshold", "mars") or mode != "greedy":  # SGLang and MARS leave greedy decoding alone
        assert int(n.sum()) > int(reference.n_accepted.sum())
    union = torch.zeros_like(x.draft.tokens, dtype=torch.bool)
    for mask in v.reasons.values():
        assert not bool((union & mask).any()), "reason masks overlap"
        union |= mask
    assert torch.equal(union, rules.prefix_mask(v.n_accepted, x.k))
    assert v.target_tokens is not None and v.target_tokens.shape == x.draft.tokens.shape


# -- batches ----------------------------------------------------------------------------------------------------

ALL = {**{f"{k} (lossy)": v for k, v in LOSSY.items()}, **LIMITS}


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_batch_of_rows_is_judged_as_each_row_alone(name):
    """Greedy: one call on B=3 equals each row alone; every mode: rows of different draft lengths (verify_rows)
    give what each row gives alone with its own stream."""
    rule = ALL[name]()
    x = random_input("greedy", 5, B=3)
    batched = rule(x)
    for row in range(3):
        alone = rule(VerifyInput(Draft(x.draft.tokens[row : row + 1], x.draft.probs[row : row + 1]),
                                 x.target_logits[row : row + 1], False))
        assert batched.n_accepted[row] == alone.n_accepted[0] and batched.next_token[row] == alone.next_token[0]
    lengths = torch.tensor([4, 2, 0])
    for mode in MODES:
        base = random_input(mode, 6, B=3)
        gens = [CoupledNoise(60 + r) if mode == "coupled" else torch.Generator().manual_seed(60 + r) for r in range(3)]
        x = VerifyInput(Draft(base.draft.tokens, base.draft.probs, lengths=lengths), base.target_logits, base.do_sample,
                        generator=gens)
        _, verdict = verify_rows(rule, x)
        for row in range(3):
            m = int(lengths[row])
            gen = CoupledNoise(60 + row) if mode == "coupled" else torch.Generator().manual_seed(60 + row)
            alone = rule(VerifyInput(Draft(base.draft.tokens[row : row + 1, :m], base.draft.probs[row : row + 1, :m]),
                                     base.target_logits[row : row + 1, : m + 1], base.do_sample, generator=gen))
            assert verdict.n_accepted[row] == alone.n_accepted[0], (mode, row)
            assert verdict.next_token[row] == alone.next_token[0], (mode, row)
            assert verdict.n_accepted[row] <= m


# -- end to end on tiny random models: the lossless limits equal the target alone --------------------------------

E2E_LIMITS = [
    ("threshold", {}),
    ("relaxed_topk", {"topk": 1, "delta": 0.5}),
    ("relaxed_topk", {"topk": 3, "delta": 0.0}),
    ("ensemble", {"weight": 1.0}),
]
ROWS = [torch.tensor([3, 17, 9, 41, 5, 22, 8]), torch.tensor([30, 2, 11])]


@pytest.fixture(scope="module")
def pair():
    return tiny_model(0, vocab=64, init_std=0.3), tiny_model(0, vocab=64, init_std=0.3, layers=1)


GREEDY_LIMITS = [*E2E_LIMITS, ("mars", {"theta": 0.9})]  # MARS relaxes nothing under greedy decoding


@pytest.mark.parametrize("name,params", GREEDY_LIMITS, ids=[f"{n}{p}" for n, p in GREEDY_LIMITS])
def test_at_the_lossless_limit_greedy_generation_equals_the_target_alone(pair, name, params):
    target, draft = pair
    ids, mask = left_padded(ROWS)
    rule = get_rule(name, **params)
    out = generate(target, ids, attention_mask=mask, pad_token_id=0, assistant_model=draft, rule=rule,
                   num_assistant_tokens=4, max_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    expected = target.generate(ids, attention_mask=mask, pad_token_id=0, max_new_tokens=16, do_sample=False)
    assert torch.equal(out.sequences, expected)
    assert out.spec_stats.accepted > 0  # drafts were kept, so the identity is not vacuous


def vanilla_coupled(target, prompt: torch.Tensor, seed: int, tokens: int) -> torch.Tensor:
    out, _ = speculative_generate(target, prompt[None], drafter=NoDrafter(), rule=SpeculativeSampling(), k=4,
                                  max_new_tokens=tokens, sampler=Sampler(True, 0.8), generator=CoupledNoise(seed))
    return out[0, len(prompt) :]


@pytest.mark.parametrize("name,params", E2E_LIMITS, ids=[f"{n}{p}" for n, p in E2E_LIMITS])
def test_at_the_lossless_limit_coupled_sampling_equals_vanilla(pair, name, params):
    target, draft = pair
    ids, mask = left_padded(ROWS)
    out = generate(target, ids, attention_mask=mask, pad_token_id=0, assistant_model=draft,
                   rule=get_rule(name, **params), num_assistant_tokens=4, max_new_tokens=16, do_sample=True,
                   temperature=0.8, generator=[CoupledNoise(11), CoupledNoise(12)], return_dict_in_generate=True)
    for row, prompt in enumerate(ROWS):
        assert torch.equal(out.sequences[row, ids.shape[1] :], vanilla_coupled(target, prompt, 11 + row, 16))
    assert out.spec_stats.accepted > 0


def test_a_lossy_setting_changes_coupled_output_and_logs_substitutions(pair):
    target, draft = pair
    prompt = ROWS[0]
    out = generate(target, prompt[None], assistant_model=draft, rule=get_rule("relaxed_topk", topk=40, delta=1.0),
                   num_assistant_tokens=4, max_new_tokens=24, do_sample=True, temperature=0.8,
                   generator=CoupledNoise(3), return_dict_in_generate=True)
    assert out.spec_stats.reasons.get("topk", 0) > 0 and out.spec_stats.substitutions
    assert not torch.equal(out.sequences[0, len(prompt) :], vanilla_coupled(target, prompt, 3, 24))


# -- parameters, registration, presets ---------------------------------------------------------------------------

@pytest.mark.parametrize("build,argument", [
    (lambda: ThresholdAcceptance(threshold_single=-0.1), "threshold_single"),
    (lambda: ThresholdAcceptance(threshold_acc=0.0), "threshold_acc"),
    (lambda: ThresholdAcceptance(threshold_acc=1.5), "threshold_acc"),
    (lambda: ThresholdAcceptance(threshold_single="high"), "threshold_single"),
    (lambda: RelaxedTopK(topk=0), "topk"),
    (lambda: RelaxedTopK(topk=2.5), "topk"),
    (lambda: RelaxedTopK(delta=-1.0), "delta"),
    (lambda: RelaxedTopK(space="logit"), "space"),
    (lambda: EnsembleVerification(weight=0.0), "weight"),
    (lambda: EnsembleVerification(weight=1.2), "weight"),
    (lambda: EnsembleVerification(weight=math.nan), "weight"),
    (lambda: MarginAwareVerification(theta="high"), "theta"),
    (lambda: MarginAwareVerification(theta=math.nan), "theta"),
])
def test_bad_parameters_are_refused_naming_the_argument(build, argument):
    with pytest.raises(ValueError, match=argument):
        build()


def test_rules_and_presets_are_registered():
    assert {"threshold", "relaxed_topk", "ensemble", "mars"} <= set(available_rules())
    for name in ("threshold", "relaxed_topk", "ensemble", "mars"):
        rule = get_rule(name)  # the engines' defaults are lossless; MARS has no lossless setting when sampling
        assert rule.name == name and rule.lossless == (name != "mars")
        method = get_method(name)
        assert method.drafter == "model" and method.k == 5 and method.rule == name
        assert not method.lossless(RunContext())
    assert get_method("relaxed_topk").rule_params == {"topk": 3, "delta": math.log(2), "space": "log"}
    rule = parse_method("relaxed_topk:topk=5,delta=0.2,space=prob,k=4").checked_rule()
    assert (rule.topk, rule.delta, rule.space) == (5, 0.2, "prob")
    with pytest.raises(ValueError, match="topk"):
        parse_method("relaxed_topk:topk=0")
    with pytest.raises(ValueError, match="draft probabilities"):
        Method("ensemble_pld", "prompt_lookup", "ensemble", {"weight": 0.5}).checked_rule()
