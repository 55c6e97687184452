"""Step-level rules: the token veto and the two baselines on tensors, and each rule's reject-everything
limit through the loop, which must be exactly target decoding (fp32)."""

from __future__ import annotations

import math

import pytest
import torch

from semverify import Sampler, get_rule, speculative_generate
from semverify.registry import DraftResources, make_drafter
from semverify.semanticspec import (
    SemanticProbe,
    SpecReason,
    StepDraft,
    StepDrafter,
    StepLikelihood,
    StepSegmenter,
    StepTokensDraft,
    token_veto,
)
from semverify.semanticspec.baselines import digit_ids, judge_suffix
from semverify.semanticspec.steps import StepRule
from semverify.types import VerifyInput
from tests.helpers import byte_tokenizer, tiny_model

TOK = byte_tokenizer()


def step_input(tokens: list[int], probs: list[list[float]], extend=None) -> VerifyInput:
    """A drafted step of ``tokens`` whose target distributions (one row per step token, plus the next) are ``probs``."""
    logits = torch.tensor(probs, dtype=torch.float).clamp_min(1e-12).log()[None]
    draft = StepDraft(tokens=torch.tensor([tokens]), pooled_hidden=torch.zeros(1, 4))
    return VerifyInput(draft, logits, False, None, torch.Generator().manual_seed(0), extend=extend)


# four-token vocabulary: the step is [0, 1]; the target is sure of token 0, then unsure between 1 and 2
SURE = [0.97, 0.01, 0.01, 0.01]
UNSURE = [0.05, 0.40, 0.50, 0.05]
NEXT = [0.25, 0.25, 0.25, 0.25]


def test_token_veto_top_k_and_confident_floor():
    x = step_input([0, 1], [SURE, UNSURE, NEXT])
    assert token_veto(x) == {}  # switched off by default
    assert not token_veto(x, top_k=2)["veto_topk"].item()  # token 1 is the target's second choice
    assert token_veto(x, top_k=1)["veto_topk"].item()
    y = step_input([1, 1], [SURE, UNSURE, NEXT])  # token 1 where the target is 97% sure of token 0
    assert token_veto(y, confidence=0.9, floor=0.05)["veto_floor"].item()
    assert not token_veto(y, confidence=0.99, floor=0.05)["veto_floor"].item()  # not confident enough to veto
    assert not token_veto(x, confidence=0.9, floor=0.05)["veto_floor"].item()  # token 0 is the sure choice


class CountingRule(StepRule):
    name = "counting"

    def __init__(self, **veto):
        super().__init__(**veto)
        self.judged = 0

    def judge(self, x):
        self.judged += 1
        return torch.ones(1, dtype=torch.bool), {"judged": torch.ones(1)}


def test_a_vetoed_step_is_rejected_before_the_judge_runs():
    rule = CountingRule(veto_top_k=1)
    v = rule(step_input([0, 1], [SURE, UNSURE, NEXT]))
    assert rule.judged == 0 and int(v.n_accepted) == 0 and int(v.next_token) == 0  # the target's own first token
    assert v.reasons["veto_topk"].tolist() == [[True, False]] and v.reasons["step_rejected"].tolist() == [[True, False]]
    v = CountingRule(veto_top_k=2)(step_input([0, 1], [SURE, UNSURE, NEXT]))
    assert int(v.n_accepted) == 2 and not v.reasons["veto_topk"].any() and v.scores["step_accepted"].item() == 1
    with pytest.raises(ValueError, match="veto_top_k"):
        CountingRule(veto_top_k=0)


def test_token_drafts_of_a_step_the_target_writes_go_to_the_token_rule():
    x = step_input([0, 2], [SURE, UNSURE, NEXT])
    x.draft = StepTokensDraft(tokens=x.draft.tokens)
    v = CountingRule(veto_top_k=1)(x)  # greedy token-level verification: 0 matches, 2 is the argmax
    assert int(v.n_accepted) == 2 and "exact" in v.reasons


def test_step_likelihood_thresholds():
    x = step_input([0, 1], [SURE, UNSURE, NEXT])
    mean = (math.log(0.97) + math.log(0.40)) / 2
    v = StepLikelihood(min_mean_logprob=mean - 0.01)(x)
    assert int(v.n_accepted) == 2 and v.scores["step_mean_logprob"].item() == pytest.approx(mean, abs=1e-5)
    assert v.scores["step_min_prob"].item() == pytest.approx(0.40, abs=1e-5)
    assert int(StepLikelihood(min_mean_logprob=mean + 0.01)(x).n_accepted) == 0
    assert int(StepLikelihood(min_token_prob=0.41)(x).n_accepted) == 0
    assert int(StepLikelihood(min_token_prob=0.39)(x).n_accepted) == 2
    with pytest.raises(ValueError, match="min_mean_logprob"):
        StepLikelihood(min_mean_logprob=float("nan"))


def fake_extend(score_token: int, weight: float = 8.0):
    """An ``extend`` whose last row puts most mass on ``score_token`` (the target's answer to the judge)."""
    def extend(tokens):
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], len(TOK))
        logits[:, -1, score_token] = weight
        return logits
    return extend


def test_specreason_reads_the_score_of_the_judging_turn():
    digits = digit_ids(TOK)
    suffix = TOK.decode(judge_suffix(TOK))
    assert suffix.startswith("<|im_end|>\n<|im_start|>user\nEvaluate the last reasoning step")
    assert suffix.endswith("<|im_start|>assistant\nI think the quality score is: ")
    asked = []

    def extend(tokens):
        asked.append(TOK.decode(tokens[0]))
        return fake_extend(digits[8])(tokens)

    x = step_input([0, 1], [SURE, UNSURE, NEXT], extend)
    v = SpecReason(TOK, threshold=7.0)(x)
    assert asked == [suffix] and int(v.n_accepted) == 2 and 7.5 < v.scores["judge_score"].item() < 8.0
    assert int(SpecReason(TOK, threshold=8.5)(x).n_accepted) == 0
    greedy = SpecReason(TOK, threshold=8, score="greedy")(x)
    assert greedy.scores["judge_score"].item() == 8 and int(greedy.n_accepted) == 2
    not_a_digit = step_input([0, 1], [SURE, UNSURE, NEXT], fake_extend(TOK("x").input_ids[0]))
    assert SpecReason(TOK, threshold=0.5, score="greedy")(not_a_digit).scores["judge_score"].item() == 0
    with pytest.raises(ValueError, match="extend"):
        SpecReason(TOK)(step_input([0, 1], [SURE, UNSURE, NEXT]))
    with pytest.raises(ValueError, match="tokenizer"):
        get_rule("specreason")


def reject_everything():
    """Each step rule at its reject-everything setting (veto settings included)."""
    pair = {"pair": "tiny"}
    target_probe, draft_probe = SemanticProbe(32, width=4, meta=pair), SemanticProbe(32, width=4, meta=pair)
    return {
        "semanticspec r_min > 1": get_rule("semanticspec", draft_probe=draft_probe, target_probe=target_probe,
                                           r_min=1.5),
        "step_likelihood mean > 0": StepLikelihood(min_mean_logprob=0.1),
        "step_likelihood min prob > 1": StepLikelihood(min_token_prob=1.1),
        "specreason threshold > 9": SpecReason(TOK, threshold=9.5),
        "veto top-1 on a random pair": StepLikelihood(veto_top_k=1, veto_confidence=0.0, veto_floor=1.0),
    }


@pytest.mark.parametrize("name", list(reject_everything()))
@pytest.mark.parametrize("seed", [0, 1])
def test_rejecting_every_step_is_target_decoding(name, seed):
    rule = reject_everything()[name]
    target = tiny_model(seed, arch="llama", vocab=len(TOK))
    draft = tiny_model(seed + 20, arch="llama", vocab=len(TOK))
    ids = TOK("Question: what is 2 + 2?", return_tensors="pt").input_ids
    expected = target.generate(ids, do_sample=False, max_new_tokens=40)
    drafter = StepDrafter(draft, StepSegmenter(TOK, stops=("\ufffd", " ", "e"), max_step_tokens=6), token_k=3,
                          target_first_step=False)
    out, stats = speculative_generate(target, ids, drafter=drafter, rule=rule, k=6, max_new_tokens=40)
    assert torch.equal(out, expected)
    assert stats.reasons["step_rejected"] > 0 and stats.reasons["step"] == 0


def test_step_int8_writes_steps_with_the_int8_draft_model():
    plain, int8 = tiny_model(1, arch="llama", vocab=len(TOK)), tiny_model(2, arch="llama", vocab=len(TOK))
    both = DraftResources(draft_model=plain, draft_model_int8=int8, tokenizer=TOK)
    drafter = make_drafter("step_int8", both, 6)
    assert isinstance(drafter, StepDrafter) and drafter.model is int8 and drafter.segmenter.max_step_tokens == 6
    assert make_drafter("step", both, 6).model is plain
    with pytest.raises(ValueError, match="int8 draft model"):
        make_drafter("step_int8", DraftResources(draft_model=plain, tokenizer=TOK), 6)


@pytest.mark.parametrize("name", list(reject_everything()))
def test_rejecting_every_step_under_coupled_sampling_is_coupled_target_decoding(name):
    from semverify import NoDrafter, Sampler
    from semverify.engine.coupling import CoupledNoise

    rule = reject_everything()[name]
    target = tiny_model(0, arch="llama", vocab=len(TOK))
    draft = tiny_model(20, arch="llama", vocab=len(TOK))
    ids = TOK("Question: what is 2 + 2?", return_tensors="pt").input_ids
    sampler = Sampler(True, 0.8)
    for seed in range(2):
        expected, _ = speculative_generate(target, ids, drafter=NoDrafter(), rule=get_rule("speculative"),
                                           k=6, max_new_tokens=40, sampler=sampler,
                                           generator=CoupledNoise(seed))
        drafter = StepDrafter(draft, StepSegmenter(TOK, stops=("\ufffd", " ", "e"), max_step_tokens=6), token_k=3,
                              target_first_step=False)
        out, stats = speculative_generate(target, ids, drafter=drafter, rule=rule, k=6,
                                          max_new_tokens=40, sampler=sampler, generator=CoupledNoise(seed))
        assert torch.equal(out, expected)
        assert stats.reasons["step_rejected"] > 0 and stats.reasons["step"] == 0


STEP_PROMPTS = ["Question: what is 2 + 2?", "Q: 7 * 6 =", "Tom has 3 apples and buys 4 more. How many?"]


def step_batch():
    """The step prompts as a left-padded batch, with each row's own ids."""
    rows = [TOK(p, return_tensors="pt").input_ids[0] for p in STEP_PROMPTS]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    return rows, ids, mask


def step_drafter(draft, first: bool = False, rounds: int = 0) -> StepDrafter:
    return StepDrafter(draft, StepSegmenter(TOK, stops=("\ufffd", " ", "e"), max_step_tokens=6), token_k=3,
                       target_first_step=first, rounds=rounds)


@pytest.fixture(params=[0, 2])
def rounds(request, monkeypatch):
    """Each draft finished in its step (0), or a batch's draft forwards stopped after 2 (or the test's number) once a
    row has finished (rows still drafting wait and go on at the next step); yields (rounds, rows waiting per step)."""
    from semverify.engine import loop

    waits, verify = [], loop.verify
    monkeypatch.setattr(loop, "verify", lambda target, cache, step, *rest: waits.append(
        len(step.draft.tokens) - len(step.ready)) or verify(target, cache, step, *rest))
    yield request.param, waits
    assert (sum(waits) > 0) == (request.param > 0), waits  # rows waited exactly when drafts may stop early


@pytest.mark.parametrize("name", [n for n in reject_everything() if not n.startswith("specreason")])
def test_a_batch_rejecting_every_step_is_batched_target_decoding(name, rounds):
    rule = reject_everything()[name]
    target, draft = tiny_model(0, arch="llama", vocab=len(TOK)), tiny_model(20, arch="llama", vocab=len(TOK))
    _, ids, mask = step_batch()
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40, pad_token_id=0)
    out, stats = speculative_generate(target, ids, attention_mask=mask, drafter=step_drafter(draft, rounds=rounds[0]),
                                      rule=rule, k=6, max_new_tokens=40, pad_token_id=0)
    assert torch.equal(out, expected)
    assert stats.reasons["step_rejected"] > 0 and stats.reasons["step"] == 0


def accepting_rules():
    """Step rules that accept some steps and reject others on the tiny pair."""
    pair = {"pair": "tiny"}
    torch.manual_seed(0)  # the probes' initial weights
    probes = dict(draft_probe=SemanticProbe(32, width=4, meta=pair), target_probe=SemanticProbe(32, width=4, meta=pair))
    return {"semanticspec": get_rule("semanticspec", r_min=0.0, **probes),
            "step_likelihood": StepLikelihood(min_mean_logprob=-5.5)}


@pytest.fixture(params=["one forward", "split by length"])
def verification(request, monkeypatch):
    """Batched verification as one forward, or split into forwards by draft length wherever lengths differ;
    yields the forwards split (None for one forward)."""
    from semverify.engine import loop, width_groups

    if request.param == "one forward":
        yield None
        return
    splits, grouped = [], loop.grouped_forward
    monkeypatch.setattr(width_groups, "FORWARD_OVERHEAD", 0)
    monkeypatch.setattr(loop, "grouped_forward", lambda *args, **kw: splits.append(args[3]) or grouped(*args, **kw))
    yield splits


@pytest.mark.parametrize("name", list(accepting_rules()))
@pytest.mark.parametrize("first", [False, True])
def test_a_batch_of_step_drafts_writes_what_each_row_writes_alone(name, first, verification, rounds):
    """Rows switch between whole steps and step tokens on their own; each draws from its own stream."""
    rule = accepting_rules()[name]
    target = tiny_model(0, vocab=len(TOK), init_std=0.3)
    draft = tiny_model(0, vocab=len(TOK), init_std=0.3, layers=1)
    rows, ids, mask = step_batch()
    streams = lambda: [torch.Generator().manual_seed(40 + r) for r in range(len(rows))]  # noqa: E731
    sampler = Sampler(True, 0.7)
    out, stats = speculative_generate(target, ids, attention_mask=mask, drafter=step_drafter(draft, first, rounds[0]),
                                      rule=rule, k=6, max_new_tokens=40, pad_token_id=0, sampler=sampler,
                                      generator=streams())
    assert stats.reasons["step"] > 0 and stats.reasons["step_rejected"] > 0, dict(stats.reasons)
    for row, (prompt, stream) in enumerate(zip(rows, streams())):
        alone, _ = speculative_generate(target, prompt[None], drafter=step_drafter(draft, first), rule=rule, k=6,
                                        max_new_tokens=40, sampler=sampler, generator=stream)
        assert torch.equal(out[row, ids.shape[1] : ids.shape[1] + alone.shape[1] - len(prompt)],
                           alone[0, len(prompt):])
    assert verification is None or verification  # drafts of different lengths were verified apart


@pytest.mark.parametrize("context", [None, 2])  # noise keyed by position, or by the last two tokens
def test_a_coupled_batch_rejecting_every_step_is_coupled_target_decoding(rounds, context):
    from semverify import NoDrafter
    from semverify.engine.coupling import CoupledNoise

    target, draft = tiny_model(0, arch="llama", vocab=len(TOK)), tiny_model(20, arch="llama", vocab=len(TOK))
    rows, ids, mask = step_batch()
    sampler = Sampler(True, 0.8)
    out, stats = speculative_generate(target, ids, attention_mask=mask, drafter=step_drafter(draft, rounds=rounds[0]),
                                      rule=StepLikelihood(min_mean_logprob=0.1), k=6, max_new_tokens=30,
                                      pad_token_id=0, sampler=sampler,
                                      generator=[CoupledNoise(7, r, context=context) for r in range(len(rows))])
    assert stats.reasons["step_rejected"] > 0
    for row, prompt in enumerate(rows):
        alone, _ = speculative_generate(target, prompt[None], drafter=NoDrafter(), rule=get_rule("speculative"), k=6,
                                        max_new_tokens=30, sampler=sampler,
                                        generator=CoupledNoise(7, row, context=context))
        assert torch.equal(out[row, ids.shape[1] : ids.shape[1] + alone.shape[1] - len(prompt)], alone[0, len(prompt):])


class RecordingStepDrafter(StepDrafter):
    """A step drafter that keeps the length of every token draft it proposed while the target wrote a step."""

    def propose_rows(self, sequences, ks, sampler, generators):
        draft = super().propose_rows(sequences, ks, sampler, generators)
        self.token_lengths = getattr(self, "token_lengths", []) + [
            d.length for d in draft.rows if isinstance(d, StepTokensDraft)]
        return draft


def rider_rule():
    """SemanticSpec with random probes: it accepts some steps and rejects others on the tiny pair, greedy or coupled."""
    torch.manual_seed(0)  # the probes' initial weights
    pair = {"pair": "tiny"}
    return get_rule("semanticspec", r_min=1.0, draft_probe=SemanticProbe(32, width=4, meta=pair),
                    target_probe=SemanticProbe(32, width=4, meta=pair))


@pytest.mark.parametrize("rounds", [0, 4], indirect=True)  # riders draft on while others do: up to 4 > token_k
@pytest.mark.parametrize("coupled", [False, True])
def test_token_drafts_ride_along_with_step_drafts_and_rows_still_write_what_they_write_alone(coupled, verification,
                                                                                             rounds):
    """Greedy or coupled: a row the target writes drafts on while other rows draft steps (beyond token_k),
    and the batch changes no row's output."""
    from semverify.engine.coupling import CoupledNoise

    rule = rider_rule()
    target = tiny_model(0, vocab=len(TOK), init_std=0.3)
    draft = tiny_model(0, vocab=len(TOK), init_std=0.3, layers=1)
    rows, ids, mask = step_batch()
    sampler = Sampler(coupled, 0.7)
    # the legacy noise draws the instance this test was built on (rows whose steps the target writes, so tokens ride)
    noise = (lambda r: CoupledNoise(3, r, noise="legacy")) if coupled else (lambda r: None)  # noqa: E731
    segmenter = StepSegmenter(TOK, stops=("\ufffd", " ", "e"), max_step_tokens=6)
    batched = RecordingStepDrafter(draft, segmenter, token_k=2, target_first_step=True, rounds=rounds[0])
    out, stats = speculative_generate(target, ids, attention_mask=mask, drafter=batched, rule=rule, k=6,
                                      max_new_tokens=40, pad_token_id=0, sampler=sampler,
                                      generator=[noise(r) for r in range(len(rows))] if coupled else None)
    assert stats.reasons["step"] > 0 and stats.reasons["step_rejected"] > 0, dict(stats.reasons)
    assert max(batched.token_lengths) > 2  # rode along
    for row, prompt in enumerate(rows):
        alone = RecordingStepDrafter(draft, segmenter, token_k=2, target_first_step=True)
        expected, _ = speculative_generate(target, prompt[None], drafter=alone, rule=rule, k=6, max_new_tokens=40,
                                           sampler=sampler, generator=noise(row))
        assert max(alone.token_lengths) <= 2
        assert torch.equal(out[row, ids.shape[1] : ids.shape[1] + expected.shape[1] - len(prompt)],
                           expected[0, len(prompt):])
    assert verification is None or verification


@pytest.mark.parametrize(("draws", "rides"), [("greedy", True), ("coupled", True), ("torch", False)])
def test_token_drafts_ride_only_where_draws_are_keyed_by_position(draws, rides):
    """Under torch streams extra draft draws would shift a row's later draws: there token drafts keep token_k."""
    from semverify.engine.coupling import CoupledNoise

    draft = tiny_model(0, vocab=len(TOK), init_std=0.3, layers=1)
    rows, _, _ = step_batch()
    drafter = StepDrafter(draft, StepSegmenter(TOK, stops=("\x00\x00\x00",), max_step_tokens=6), token_k=2)
    drafter.reset_rows(rows)
    drafter.writing = ["draft", "target", "target"]
    generators = {"greedy": [None] * 3, "coupled": [CoupledNoise(0, r) for r in range(3)],
                  "torch": [torch.Generator().manual_seed(r) for r in range(3)]}[draws]
    proposed = drafter.propose_rows(rows, [6] * 3, Sampler(draws != "greedy", 0.7), generators)
    assert [d.length for d in proposed.rows] == ([6, 6, 6] if rides else [6, 2, 2])


def test_the_target_writes_the_break_that_ends_its_step():
    """A token draft stops at the token that completes the step's break and drops it (greedy: the draft's own
    third token is made the break), so a step the target writes always ends with the target's token."""
    draft = tiny_model(0, vocab=len(TOK), init_std=0.3, layers=1)
    prompt = TOK("Q: 7 * 6 =", return_tensors="pt").input_ids[0]
    free = StepDrafter(draft, StepSegmenter(TOK, stops=("\x00\x00\x00",)), token_k=5)
    free.reset_rows([prompt])
    tokens = free.propose_rows([prompt], [5], Sampler(False), [None]).rows[0].tokens[0].tolist()
    stop = TOK.decode(tokens[:3])
    assert len(tokens) == 5 and stop not in TOK.decode(tokens[:2])
    drafter = StepDrafter(draft, StepSegmenter(TOK, stops=(stop,)), token_k=5)
    drafter.reset_rows([prompt])
    proposed = drafter.propose_rows([prompt], [5], Sampler(False), [None]).rows[0]
    assert isinstance(proposed, StepTokensDraft) and proposed.tokens[0].tolist() == tokens[:2]
