"""EASD: the rule on hand-built tensors, its lossless limit through the loop, calibration and its CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semverify import Sampler, generate, get_rule
from semverify.drafters import ModelDrafter, PromptLookupDrafter
from semverify.easd import EntropyAwareRule, EntropyCalibration, find_calibration, make_easd
from semverify.easd.calibrate import calibrate_entropy
from semverify.engine.loop import speculative_generate
from semverify.registry import RunContext
from semverify.rules import SpeculativeSampling, entropy
from semverify.types import Draft, VerifyInput
from tests.helpers import TINY_VOCAB, byte_tokenizer, check_verdict_bounds, tiny_model

INF = float("inf")


def easd_input(tokens, q, target_logits, do_sample, seed=0) -> VerifyInput:
    return VerifyInput(draft=Draft(tokens=torch.as_tensor(tokens), probs=q), target_logits=target_logits,
                       do_sample=do_sample, generator=torch.Generator().manual_seed(seed))


def random_case(seed: int, k: int = 4, vocab: int = 12, batch: int = 2, scale: float = 1.0):
    """Random draft q (tokens drawn from it) and target logits for k+1 positions."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g) * scale, -1)
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    return tokens, q, torch.randn(batch, k + 1, vocab, generator=g) * scale


# ----------------------------------------------------------------------------------------------------------------------
# the rule on tensors


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_infinite_thresholds_are_standard_sd(seed, do_sample):
    tokens, q, logits = random_case(seed)
    easd = EntropyAwareRule(INF, INF, top_n=3, overlap=0.0)
    a = easd(easd_input(tokens, q, logits, do_sample, seed))
    b = SpeculativeSampling()(easd_input(tokens, q, logits, do_sample, seed))
    assert torch.equal(a.n_accepted, b.n_accepted) and torch.equal(a.next_token, b.next_token)
    assert "penalty" not in a.reasons  # a lossless setting: the engine keeps the target's own tokens


@pytest.mark.parametrize("resample", ["target", "residual"])
def test_flat_overlapping_distributions_trigger_the_penalty(resample):
    vocab, k = 8, 3
    flat = torch.full((1, k, vocab), 1.0 / vocab)
    logits = torch.zeros(1, k + 1, vocab)  # the target is flat too: both uncertain, top-N sets equal
    rule = EntropyAwareRule(1.0, 1.0, top_n=4, overlap=0.5, resample=resample)
    for seed in range(300):
        tokens = torch.randint(0, vocab, (1, k), generator=torch.Generator().manual_seed(seed))
        v = rule(easd_input(tokens, flat, logits, True, seed))
        # q == p, so the ratio test accepts everything: only the penalty can stop at position 0
        assert int(v.n_accepted) == 0
        assert v.reasons["penalty"].tolist() == [[True, False, False]]
        assert int(v.next_token) != int(tokens[0, 0])


def test_greedy_penalty_emits_the_targets_second_choice():
    logits = torch.tensor([[0.5, 0.4, 0.3, 0.2, 0.1, 0.0]] * 3)[None]  # near-flat, argmax 0, second 1
    q = torch.softmax(torch.tensor([[0.5, 0.45, 0.3, 0.2, 0.1, 0.0]] * 2), -1)[None]
    rule = EntropyAwareRule(1.0, 1.0, top_n=3, overlap=0.6)
    v = rule(easd_input([[0, 0]], q, logits, False))
    assert int(v.n_accepted) == 0 and int(v.next_token) == 1
    assert v.reasons["penalty"].tolist() == [[True, False]] and not v.reasons["exact"].any()
    # without the penalty it is greedy matching: both drafts accepted, then the bonus argmax
    v = EntropyAwareRule(INF, 1.0)(easd_input([[0, 0]], q, logits, False))
    assert int(v.n_accepted) == 2 and int(v.next_token) == 0


def test_penalty_only_where_both_are_uncertain_and_agree():
    vocab = 10
    flat = torch.zeros(vocab)
    peaked = torch.tensor([9.0] + [0.0] * (vocab - 1))
    reversed_top = torch.arange(vocab, dtype=torch.float) * 0.01  # top set at the other end
    q = torch.softmax(torch.stack([flat, peaked, flat, torch.zeros(vocab) - reversed_top]), -1)[None]
    p = torch.softmax(torch.stack([flat, flat, peaked, reversed_top, flat]), -1)[None]
    rule = EntropyAwareRule(1.5, 1.5, top_n=3, overlap=0.6)
    mask = rule.uncertain_agreement(q, p[:, :4])
    # flat & flat with equal (tied) top sets; peaked draft; peaked target; opposite top sets
    assert mask.tolist() == [[True, False, False, False]]


def test_the_papers_ablations_drop_one_condition_each():
    vocab = 10
    flat = torch.zeros(vocab)
    peaked = torch.tensor([9.0] + [0.0] * (vocab - 1))
    reversed_top = torch.arange(vocab, dtype=torch.float) * 0.01
    q = torch.softmax(torch.stack([flat, peaked, flat, torch.zeros(vocab) - reversed_top]), -1)[None]
    p = torch.softmax(torch.stack([flat, peaked, peaked, reversed_top]), -1)[None]
    both = EntropyAwareRule(1.5, 1.5, top_n=3, overlap=0.6)
    entropy_only = EntropyAwareRule(1.5, 1.5, top_n=3, overlap=0.6, use_overlap=False)
    overlap_only = EntropyAwareRule(1.5, 1.5, top_n=3, overlap=0.6, use_entropy=False)
    # positions: both flat and agreeing; both peaked on token 0; flat draft and peaked target; flat, disjoint tops
    assert both.uncertain_agreement(q, p).tolist() == [[True, False, False, False]]
    assert entropy_only.uncertain_agreement(q, p).tolist() == [[True, False, False, True]]  # overlap ignored
    assert overlap_only.uncertain_agreement(q, p).tolist() == [[True, True, True, False]]  # entropy ignored
    neither = EntropyAwareRule(1.5, 1.5, use_entropy=False, use_overlap=False)
    assert neither.uncertain_agreement(q, p).all()  # no condition left: every agreed token is penalised


@pytest.mark.parametrize("seed", range(4))
def test_the_entropy_only_ablation_at_infinite_thresholds_is_standard_sd(seed):
    tokens, q, logits = random_case(seed)
    for do_sample in (False, True):
        x, y = (easd_input(tokens, q, logits, do_sample, seed) for _ in range(2))
        ablated = EntropyAwareRule(INF, INF, use_overlap=False)(x)
        plain = SpeculativeSampling()(y) if do_sample else get_rule("greedy")(y)
        assert torch.equal(ablated.n_accepted, plain.n_accepted) and torch.equal(ablated.next_token, plain.next_token)


def test_thresholds_that_never_trigger_leave_acceptance_unchanged():
    """Finite thresholds above any possible entropy (log V) change no acceptance count."""
    vocab = 12
    above = math.log(vocab) + 1e-3
    for rule in (EntropyAwareRule(above, 0.0, top_n=4, overlap=0.0),
                 EntropyAwareRule(0.0, above, top_n=4, overlap=0.0)):
        counts = [], []
        for seed in range(200):
            tokens, q, logits = random_case(seed, vocab=vocab, batch=1)
            v = rule(easd_input(tokens, q, logits, True, seed))
            assert not v.reasons["penalty"].any()
            counts[0].append(int(v.n_accepted))
            counts[1].append(int(SpeculativeSampling()(easd_input(tokens, q, logits, True, seed)).n_accepted))
        assert counts[0] == counts[1]


def test_residual_resample_avoids_tokens_the_draft_already_covers():
    q = torch.tensor([[[0.3, 0.3, 0.2, 0.1, 0.05, 0.05]]])
    p_probs = torch.tensor([[0.3, 0.3, 0.1, 0.2, 0.05, 0.05]] * 2)[None]
    logits = p_probs.log()
    rule = EntropyAwareRule(0.5, 0.5, top_n=3, overlap=0.3, resample="residual")
    seen = set()
    for seed in range(400):
        v = rule(easd_input([[1]], q, logits, True, seed))
        if v.reasons["penalty"].any():
            seen.add(int(v.next_token))
    # p without token 1, minus q: positive only at token 3 (0.2 - 0.1)
    assert seen == {3}


def test_rule_refuses_a_draft_without_probabilities():
    x = easd_input([[1, 2]], None, torch.zeros(1, 3, 8), True)
    with pytest.raises(ValueError, match="needs the draft distribution"):
        EntropyAwareRule(1.0, 1.0)(x)


def test_loop_refuses_a_drafter_without_probabilities():
    model = tiny_model(0)
    with pytest.raises(ValueError, match="draft"):
        speculative_generate(model, torch.tensor([[1, 2, 1, 2]]), drafter=PromptLookupDrafter(),
                             rule=EntropyAwareRule(1.0, 1.0), k=3, max_new_tokens=4)


def test_normalised_entropy_thresholds():
    vocab = 16
    flat = torch.full((1, 1, vocab), 1.0 / vocab)
    assert torch.allclose(entropy(flat), torch.tensor(math.log(vocab)))
    assert EntropyAwareRule(0.99, 0.99, normalize=True).uncertain_agreement(flat, flat).all()
    assert not EntropyAwareRule(1.0, 1.0, normalize=True).uncertain_agreement(flat, flat).any()


@pytest.mark.parametrize("kwargs, message", [
    (dict(draft_entropy=1.0, target_entropy=1.0, top_n=0), "top_n"),
    (dict(draft_entropy=1.0, target_entropy=1.0, overlap=1.5), "overlap"),
    (dict(draft_entropy=1.0, target_entropy=1.0, resample="draft"), "resample"),
    (dict(draft_entropy=float("nan"), target_entropy=1.0), "numbers"),
    (dict(), "needs thresholds"),
    (dict(draft_entropy=1.0), "needs thresholds"),
    (dict(percentile=80), "draft_calibration and target_calibration"),
    (dict(draft_calibration="a"), "needs thresholds"),
    (dict(percentile=80, draft_entropy=1.0, draft_calibration="a", target_calibration="b"), "not both"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_easd(RunContext(), **kwargs)


@st.composite
def easd_cases(draw):
    vocab = draw(st.integers(2, 24))
    k = draw(st.integers(0, 5))
    batch = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=g) * scale
    masked = (torch.rand(batch, k + 1, vocab, generator=g) < draw(st.sampled_from([0.0, 0.5])))
    masked[..., 0] = False  # every position keeps at least one token
    logits = logits.masked_fill(masked, float("-inf"))
    q = torch.softmax(torch.randn(batch, k, vocab, generator=g) * scale, -1)
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    rule = EntropyAwareRule(draw(st.sampled_from([0.0, 0.5, INF])), draw(st.sampled_from([0.0, 0.5, INF])),
                            top_n=draw(st.integers(1, 6)), overlap=draw(st.sampled_from([0.0, 0.5, 1.0])),
                            resample=draw(st.sampled_from(["target", "residual"])), normalize=draw(st.booleans()))
    x = VerifyInput(draft=Draft(tokens=tokens, probs=q), target_logits=logits, do_sample=draw(st.booleans()),
                    generator=torch.Generator().manual_seed(seed + 1))
    return x, rule


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(easd_cases())
def test_rule_properties(case):
    x, rule = case
    B, k = x.draft.tokens.shape[0], x.k
    v = rule(x)
    n, nxt = check_verdict_bounds(x, v)
    penalty = v.reasons.get("penalty", torch.zeros_like(x.draft.tokens, dtype=torch.bool))
    assert penalty.shape == (B, k) and bool((penalty.sum(-1) <= 1).all())
    for b in range(B):
        if penalty[b].any():
            at = int(penalty[b].nonzero())
            assert at == int(n[b]) and int(nxt[b]) != int(x.draft.tokens[b, at])


# ----------------------------------------------------------------------------------------------------------------------
# through the loop and generate()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lossless_limit_through_the_loop_greedy(seed):
    target, draft = tiny_model(seed), tiny_model(seed + 50)
    ids = torch.randint(0, TINY_VOCAB, (1, 12), generator=torch.Generator().manual_seed(seed))
    expected = target.generate(ids, do_sample=False, max_new_tokens=40)
    out, stats = speculative_generate(target, ids, drafter=ModelDrafter(draft), rule=EntropyAwareRule(INF, INF),
                                      k=4, max_new_tokens=40)
    assert torch.equal(out, expected) and stats.reasons["penalty"] == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lossless_limit_through_the_loop_sampled(seed):
    target, draft = tiny_model(seed, init_std=0.2), tiny_model(seed + 50, init_std=0.2)
    ids = torch.randint(0, TINY_VOCAB, (1, 12), generator=torch.Generator().manual_seed(seed))
    runs = []
    for rule in (get_rule("speculative"), EntropyAwareRule(INF, INF)):
        out, stats = speculative_generate(target, ids, drafter=ModelDrafter(draft), rule=rule, k=4,
                                          max_new_tokens=40, sampler=Sampler(do_sample=True, temperature=0.9),
                                          generator=torch.Generator().manual_seed(123 + seed))
        runs.append((out, stats.accept_lengths))
    assert torch.equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]


def test_penalty_counted_per_position_and_changes_greedy_output():
    target = tiny_model(3)
    ids = torch.randint(0, TINY_VOCAB, (1, 10), generator=torch.Generator().manual_seed(3))
    # zero thresholds and zero overlap: every token standard SD would accept is penalised
    out = generate(target, ids, assistant_model=target, rule=EntropyAwareRule(0.0, 0.0, overlap=0.0),
                   max_new_tokens=30, num_assistant_tokens=4, return_dict_in_generate=True)
    stats = out.spec_stats
    assert stats.accepted == 0 and stats.reasons["penalty"] > 0
    assert stats.reasons_per_position["penalty"][0] == stats.reasons["penalty"]
    assert not torch.equal(out.sequences, target.generate(ids, do_sample=False, max_new_tokens=30))


# ----------------------------------------------------------------------------------------------------------------------
# calibration


def test_calibration_quantiles_and_lookup(tmp_path, monkeypatch):
    tok = byte_tokenizer()
    model = tiny_model(0, arch="llama", vocab=len(tok))
    examples = [("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n", "2 + 3 = 5.\nFinal Answer: 5"),
                ("<|im_start|>user\nHalf of 8?<|im_end|>\n<|im_start|>assistant\n", "8 / 2 = 4.\nFinal Answer: 4")]
    calib = calibrate_entropy(model, tok, examples, temperatures=(1.0, 0.5), model_name="tiny/model", progress=False)
    assert calib.n_tokens == sum(len(tok(a, add_special_tokens=False).input_ids) for _, a in examples)
    assert set(calib.quantiles) == {"1", "0.5"} and calib.vocab_size == len(tok)
    for values in calib.quantiles.values():
        assert len(values) == 101 and values == sorted(values)
        assert 0 <= values[0] and values[-1] <= math.log(len(tok)) + 1e-4
    # lower temperature sharpens every distribution, so every percentile drops
    assert all(c <= w + 1e-6 for c, w in zip(calib.quantiles["0.5"], calib.quantiles["1"]))
    q = calib.quantiles["1"]
    assert calib.threshold(80) == pytest.approx(q[80])
    assert calib.threshold(80.5) == pytest.approx((q[80] + q[81]) / 2)
    assert calib.threshold(80, normalize=True) == pytest.approx(q[80] / math.log(len(tok)))
    with pytest.raises(ValueError, match="temperatures"):
        calib.threshold(80, temperature=0.7)

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="semverify calibrate --model tiny/model"):
        find_calibration("tiny/model")
    path = calib.save(tmp_path / "entropy" / "tiny--model.json")
    assert find_calibration("tiny/model") == EntropyCalibration.load(path) == calib
    context = RunContext(draft_model="tiny/model", temperature=0.5)  # the draft's by name, the target's by file
    rule = get_rule("easd", context, percentile=80, target_calibration=str(path))
    assert rule.draft_entropy == rule.target_entropy == pytest.approx(calib.quantiles["0.5"][80])
    assert rule.artifacts == (str(path), str(path))  # runs pin the files a rule was built from
    default = get_rule("easd", context, target_calibration=str(path))
    assert default.draft_entropy == rule.draft_entropy  # calibrations and no thresholds: the 80th percentile


def test_shipped_calibrations_of_the_default_pair():
    for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):
        calib = find_calibration(name)
        assert calib.n_texts >= 300 and calib.vocab_size == 151936
        assert {"1", "0.7"} <= set(calib.quantiles)
        assert 0 < calib.threshold(50) < calib.threshold(80) < calib.threshold(95) < math.log(calib.vocab_size)


def test_calibrate_cli_then_compare_with_easd(tmp_path, monkeypatch, tiny_checkpoint):
    from semverify.cli import main

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path / "cache"))
    problems = [{"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}.\n#### {2 * a}"} for a in range(6)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    assert main(["calibrate", "--model", str(tiny_checkpoint), "--data", str(data), "--limit", "4",
                 "--temperatures", "1.0", "--dtype", "float32"]) == 0
    saved = tmp_path / "cache" / "entropy" / f"{tiny_checkpoint.name}.json"
    assert json.loads(saved.read_text())["n_texts"] == 4

    out = tmp_path / "run"
    main(["compare", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--data", "sample",
          "--limit", "2", "--max-new-tokens", "12", "--dtype", "float32", "--methods", "sd,easd:percentile=0",
          "--out", str(out), "--no-report"])
    rows = [json.loads(line) for line in (out / "rows.rank0.jsonl").open()]
    run = json.loads((out / "run.json").read_text())
    easd = next(m for m in run["methods"] if m["rule"] == "easd")
    assert easd["rule_params"] == {"percentile": 0}  # the models and temperature come from the run, not the method
    assert list(run["pins"]["methods"]["easd:percentile=0"]) == [str(saved)]  # draft and target share it here
    easd_rows = [r for r in rows if r["method"].startswith("easd")]
    assert len(easd_rows) == 2 and all("penalty" in r["reasons_per_position"] for r in easd_rows)

    # generate() tells a rule named by string the models' names: easd finds both calibrations by itself
    from transformers import AutoModelForCausalLM

    from semverify import generate

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    ids = torch.tensor([[1, 2, 3, 4]])
    got = generate(model, ids, assistant_model=model, rule="easd", max_new_tokens=8, return_dict_in_generate=True)
    assert got.spec_stats.new_tokens == 8 and "penalty" in got.spec_stats.reasons_per_position


def test_easd_without_a_calibration_fails_before_models_load(tmp_path, monkeypatch, tiny_checkpoint):
    from semverify.cli import main

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path))
    monkeypatch.setattr("evals.runner.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as info:
        main(["compare", "--target", str(tiny_checkpoint), "--draft", "no/such-draft", "--methods", "easd",
              "--out", str(tmp_path / "run")])
    assert "semverify calibrate --model no/such-draft" in str(info.value)


def test_calibration_on_the_models_own_answers(tmp_path, monkeypatch, tiny_checkpoint):
    from semverify.cli import main

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path / "cache"))
    problems = [{"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}.\n#### {2 * a}"} for a in range(3)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    args = ["calibrate", "--model", str(tiny_checkpoint), "--data", str(data), "--limit", "3", "--temperatures", "1.0",
            "--dtype", "float32", "--corpus", "id", "--max-new-tokens", "8", "--batch-size", "2"]
    assert main(args) == 0
    saved = tmp_path / "cache" / "entropy" / f"{tiny_checkpoint.name}-id.json"
    calibration = json.loads(saved.read_text())
    assert "own greedy answers" in calibration["corpus"] and calibration["n_texts"] == 3
    answers = [json.loads(line) for line in open(f"{saved}.answers.jsonl")]
    assert len(answers) == 3 and all(len(a["ids"]) <= 8 for a in answers) and calibration["n_tokens"] > 0
