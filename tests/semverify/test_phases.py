"""Phases (semverify.phases): a rule limited to a span of the output between markers, the lossless rule outside;
hand-built tensors (inside, outside, markers inside the draft switching mid-draft, a batch of rows in different
phases), text markers through a tokenizer, and the method-spec parameters."""

from __future__ import annotations

import pytest
import torch

from semverify.engine.coupling import CoupledNoise
from semverify.methods import get_method, parse_method
from semverify.phases import Phased, marker_ids
from semverify.registry import RunContext, get_rule
from semverify.relaxed import RelaxedTopK
from semverify.rules import BaseRule, GreedyMatch, SpeculativeSampling, at_position, prefix_mask, target_choices
from semverify.types import Draft, Verdict, VerifyInput
from tests.helpers import byte_tokenizer
from tests.semverify.test_relaxed_rules import MODES, random_input, same

V = 12
START, END = [10], [11, 9]  # a one-token opening marker, a two-token closing one


class AcceptAll(BaseRule):
    """Keeps every draft token, then the target's own token: makes "judged by the inner rule" visible."""

    name = "accept_all"

    def __call__(self, x: VerifyInput) -> Verdict:
        n = torch.full((x.draft.tokens.shape[0],), x.k, dtype=torch.long)
        return Verdict(n, at_position(target_choices(x), n), {"all": prefix_mask(n, x.k)})


def make(history, draft, argmax, generator=None) -> VerifyInput:
    """One row: its latest output tokens, its draft and the target's argmax at the k+1 positions (greedy)."""
    logits = torch.nn.functional.one_hot(torch.tensor([argmax]), V).float() * 5.0
    return VerifyInput(Draft(torch.tensor([draft])), logits, False, generator=generator,
                       history=torch.tensor([history]), output_lengths=torch.tensor([len(history)]))


def phased(**kwargs) -> Phased:
    return Phased(AcceptAll(), start=kwargs.pop("start", START), end=kwargs.pop("end", END), **kwargs)


CASES = [
    # history, draft, target argmax (k+1), expected n, expected next token
    pytest.param([-1, 10, 3, 4], [5, 6, 7], [1, 1, 1, 1], 3, 1, id="inside: the inner rule keeps all"),
    pytest.param([-1, -1, 3, 4], [5, 6, 7], [5, 1, 1, 1], 1, 1, id="no start marker: exact matching"),
    pytest.param([10, 3], [5, 11, 9, 7], [0, 11, 9, 2, 3], 3, 2, id="end marker mid-draft, target agrees"),
    pytest.param([10, 3], [5, 11, 9, 7], [0, 4, 9, 2, 3], 1, 4, id="end marker mid-draft, target refuses it"),
    pytest.param([3], [10, 5, 6], [10, 0, 0, 0], 3, 0, id="start marker mid-draft, target agrees"),
    pytest.param([3], [10, 5, 6], [4, 0, 0, 0], 0, 4, id="start marker mid-draft, target refuses it"),
    pytest.param([10, 3, 11], [9, 5], [9, 0, 0], 1, 0, id="end marker split between history and draft"),
    pytest.param([10, 11, 9, 3], [5, 6], [0, 0, 0], 0, 0, id="after the end marker: exact matching"),
]


@pytest.mark.parametrize("history,draft,argmax,n,nxt", CASES)
def test_inside_the_inner_rule_outside_the_lossless_one(history, draft, argmax, n, nxt):
    v = phased()(make(history, draft, argmax))
    assert v.n_accepted.tolist() == [n] and v.next_token.tolist() == [nxt]
    kept = prefix_mask(v.n_accepted, len(draft))
    union = torch.zeros_like(kept)
    for mask in v.reasons.values():
        assert not bool((union & mask).any())
        union |= mask
    assert torch.equal(union, kept)


def test_the_end_marker_and_what_follows_are_never_relaxed():
    v = phased()(make([10, 3], [5, 6, 11, 9, 8], [5, 6, 0, 0, 0, 0]))
    assert v.n_accepted.tolist() == [2]  # 5, 6 kept in phase; the marker is the target's to write
    assert v.reasons["all"].tolist() == [[True, True, False, False, False]]


def test_from_the_output_start_until_the_end_marker():
    rule = phased(start=None)
    assert rule(make([-1, 3, 4], [5, 6], [0, 0, 0])).n_accepted.tolist() == [2]
    assert rule(make([11, 9, 3], [5, 6], [0, 0, 0])).n_accepted.tolist() == [0]
    assert rule(make([3], [5, 11, 9], [0, 11, 9, 0])).n_accepted.tolist() == [3]


def test_read_once_per_step_a_drafted_end_marker_leaves_the_rest_of_the_draft_relaxed():
    """TensorRT-LLM reads the phase once per verification step: a closing marker inside a draft takes effect from
    the next step (``switch="step"``); read by position, the marker and what follows it are the target's."""
    x = make([10, 3], [5, 6, 11, 9, 8], [5, 6, 0, 0, 0, 0])
    assert phased(switch="step")(x).n_accepted.tolist() == [5]
    assert phased()(x).n_accepted.tolist() == [2]
    after = make([10, 3, 11, 9], [5, 6], [0, 0, 0])  # the next step: outside, exact matching
    assert phased(switch="step")(after).n_accepted.tolist() == [0]
    with pytest.raises(ValueError, match="phase_switch"):
        phased(switch="token")


def test_tensorrt_llms_preset_reads_its_phase_per_step():
    rule = get_method("relaxed_topk_trt").checked_rule(RunContext(tokenizer=byte_tokenizer()))
    assert isinstance(rule, Phased) and rule.switch == "step" and not rule.start and rule.end
    assert (rule.inner.topk, rule.inner.delta) == (10, 0.6)


def test_a_marker_older_than_the_window_is_forgotten():
    x = make([10, 3, 4, 5, 6], [7], [0, 0])
    assert phased(window=5)(x).n_accepted.tolist() == [1]
    assert phased(window=4)(x).n_accepted.tolist() == [0]  # start forgotten: the lossless rule decides
    assert phased(window=4).history_tokens == 4


def test_a_batch_of_rows_in_different_phases_is_judged_row_by_row():
    rows = [([-1, -1, 10, 3], [5, 6, 7, 8], [1, 1, 1, 1, 1]),
            ([-1, -1, 3, 4], [5, 6, 7, 8], [5, 1, 1, 1, 1]),
            ([-1, -1, 10, 3], [5, 11, 9, 7], [0, 11, 9, 2, 3])]
    batch = VerifyInput(Draft(torch.tensor([r[1] for r in rows])),
                        torch.nn.functional.one_hot(torch.tensor([r[2] for r in rows]), V).float() * 5.0, False,
                        history=torch.tensor([r[0] for r in rows]))
    v = phased()(batch)
    for b, (history, draft, argmax) in enumerate(rows):
        alone = phased()(make(history, draft, argmax))
        assert v.n_accepted[b] == alone.n_accepted[0] and v.next_token[b] == alone.next_token[0]
    assert v.n_accepted.tolist() == [4, 1, 3]
    assert v.scores["in_phase"].tolist() == [1.0, 0.0, 1.0]


def with_history(x: VerifyInput, history: torch.Tensor) -> VerifyInput:
    return VerifyInput(x.draft, x.target_logits, x.do_sample, generator=x.generator, history=history)


@pytest.mark.parametrize("mode", MODES)
def test_inside_throughout_it_is_the_inner_rule_and_outside_the_lossless_one(mode):
    """Token for token, random draws included (the inner rule draws first)."""
    inner = RelaxedTopK(3, 0.3)
    rule = Phased(inner, start=[100], end=[101, 102])  # markers the drafts (vocabulary 10) never hold
    for seed in range(3):
        x = random_input(mode, seed)
        rows = x.draft.tokens.shape[0]
        inside = torch.tensor([[3, 100, 4]]).expand(rows, 3)
        same(rule(with_history(x, inside)), inner(random_input(mode, seed)))
        if mode != "sampled":  # outside: the lossless rule; when sampling, its draws follow the inner rule's
            outside = torch.tensor([[3, 4, 5]]).expand(rows, 3)
            same(rule(with_history(x, outside)), SpeculativeSampling()(random_input(mode, seed)))
        assert not torch.equal(inner(random_input(mode, seed)).n_accepted, SpeculativeSampling()(x).n_accepted)


def test_coupled_noise_outside_is_matching_with_the_coupled_token():
    noise = CoupledNoise(4)
    logits = torch.randn(1, 4, V, generator=torch.Generator().manual_seed(1))
    own = noise.choose(logits)[0].tolist()
    draft = [own[0], END[0], END[1]]
    x = VerifyInput(Draft(torch.tensor([draft])), logits, True, generator=noise, history=torch.tensor([[10, 2]]))
    v = phased()(x)
    expected = GreedyMatch()(VerifyInput(Draft(torch.tensor([draft])), logits, True, generator=noise))
    assert v.n_accepted.tolist() == expected.n_accepted.tolist()
    assert v.next_token.tolist() == expected.next_token.tolist()


def test_without_the_history_the_rule_says_what_it_needs():
    x = VerifyInput(Draft(torch.tensor([[1]])), torch.zeros(1, 2, V), False)
    with pytest.raises(ValueError, match="history"):
        phased()(x)


def test_text_markers_through_the_tokenizer():
    tok = byte_tokenizer()
    assert len(marker_ids("Final Answer", tok)) == 2  # as written and after a space
    rule = Phased(AcceptAll(), end="Final Answer", tokenizer=tok)

    def judged(text: str) -> int:
        history = torch.tensor([tok.encode(text, add_special_tokens=False)])
        draft = torch.tensor([tok.encode("xy", add_special_tokens=False)])
        x = VerifyInput(Draft(draft), torch.zeros(1, 3, len(tok)), False, history=history)
        return int(rule(x).n_accepted[0])

    assert judged("so x = 5.") == 2
    assert judged("so x = 5. Final Answer: ") == 0
    assert judged("Final Answer") == 0


def test_bad_phases_are_refused():
    with pytest.raises(ValueError, match="start marker, an end marker"):
        Phased(AcceptAll())
    with pytest.raises(ValueError, match="tokenizer"):
        Phased(AcceptAll(), end="</think>")
    with pytest.raises(ValueError, match="window"):
        Phased(AcceptAll(), end=[1, 2, 3], window=2)
    with pytest.raises(TypeError):
        Phased("greedy", end=[1])


def test_method_specs_limit_any_rule_to_a_phase():
    tok = byte_tokenizer()
    context = RunContext(tokenizer=tok)
    method = parse_method("relaxed_topk:phase_start=<think>,phase_end=</think>,phase_window=512", context)
    rule = method.checked_rule(context)
    assert isinstance(rule, Phased) and isinstance(rule.inner, RelaxedTopK) and rule.window == 512
    assert rule.start == marker_ids("<think>", tok) and rule.end == marker_ids("</think>", tok)
    assert rule.name == "relaxed_topk" and not method.lossless(context)
    typical = get_rule("typical", context, posterior_threshold=0.2, phase_end="Final Answer")
    assert isinstance(typical, Phased) and typical.inner.posterior_threshold == 0.2
    assert isinstance(get_rule("mars", phase_end=151668), Phased)  # a token id needs no tokenizer
    assert get_rule("speculative", phase_end=7).lossless
    with pytest.raises(ValueError, match="tokenizer"):
        get_rule("mars", phase_end="Final Answer")
    with pytest.raises(ValueError, match="phase_window"):
        get_rule("mars", context, phase_end="x", phase_window="long")
    with pytest.raises(ValueError, match="tokenizer"):
        parse_method("mars:phase_end=</think>")


def test_sampled_positions_outside_the_span_follow_the_target():
    """Uncoupled sampling with the start marker second in the draft: the token before it and the marker are judged
    by speculative sampling (the inner rule keeps everything after), so the first two emitted tokens are exact draws
    from the target whatever the inner rule does inside."""
    from scipy.stats import chisquare

    B, g = 60000, torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, V, generator=g) * 1.2, dim=-1)
    q0 = torch.softmax(torch.randn(V, generator=g) * 1.5, dim=-1)
    q0[START[0]] = 0.0  # the first token never opens the span itself
    q0 = q0 / q0.sum()
    first = torch.multinomial(q0, B, replacement=True, generator=g)
    tokens = torch.stack([first, torch.full((B,), START[0]), torch.full((B,), 5)], dim=1)
    q = torch.zeros(B, 3, V)
    q[:, 0], q[:, 1, START[0]], q[:, 2, 5] = q0, 1.0, 1.0
    x = VerifyInput(Draft(tokens, q), torch.log(p)[None].expand(B, 4, V).clone(), True,
                    generator=torch.Generator().manual_seed(10), history=torch.full((B, 2), 3))
    v = phased()(x)
    n = v.n_accepted
    emitted0 = torch.where(n > 0, first, v.next_token)
    kept = n > 0
    emitted1 = torch.where(n[kept] > 1, START[0], v.next_token[kept])
    for emitted, target in ((emitted0, p[0]), (emitted1, p[1])):
        counts = torch.bincount(emitted, minlength=V).double()
        expected = target.double() / target.double().sum() * counts.sum()
        assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3
    assert bool((n != 2).all())  # past the marker the inner rule keeps everything
