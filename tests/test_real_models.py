"""Real packaged models, fp32 greedy: semverify output equals model.generate token for token."""

import pytest
import torch

from evals.benchmarks import GSM8K
from semverify import generate

pytestmark = pytest.mark.real


def gsm8k_ids(tokenizer, n: int) -> list[torch.LongTensor]:
    gsm8k = GSM8K()
    return [tokenizer(gsm8k.prompt(tokenizer, p), return_tensors="pt").input_ids for p in gsm8k.load(limit=n)]


def test_smollm_prompt_lookup_matches_greedy(smollm):
    model, tokenizer = smollm
    for ids in gsm8k_ids(tokenizer, 2):
        expected = model.generate(ids, do_sample=False, max_new_tokens=64)
        out = generate(model, ids, prompt_lookup_num_tokens=8, max_new_tokens=64, return_dict_in_generate=True)
        assert torch.equal(out.sequences, expected)
        assert out.spec_stats.steps < out.spec_stats.new_tokens  # lookup did accept something


def test_qwen_pair_speculative_matches_greedy(qwen_pair):
    target, draft, tokenizer = qwen_pair
    for ids in gsm8k_ids(tokenizer, 3):
        expected = target.generate(ids, do_sample=False, max_new_tokens=64)
        out = generate(target, ids, assistant_model=draft, max_new_tokens=64, return_dict_in_generate=True)
        assert torch.equal(out.sequences, expected), tokenizer.decode(out.sequences[0, ids.shape[1]:])
        assert out.spec_stats.alpha > 0.5 and out.spec_stats.tau > 2


def test_qwen_pair_sampled_is_seeded_and_counts_add_up(qwen_pair):
    target, draft, tokenizer = qwen_pair
    ids = gsm8k_ids(tokenizer, 1)[0]
    kwargs = dict(assistant_model=draft, do_sample=True, temperature=0.7, top_p=0.8, top_k=20, max_new_tokens=24,
                  return_dict_in_generate=True)
    first = generate(target, ids, generator=torch.Generator().manual_seed(7), **kwargs)
    again = generate(target, ids, generator=torch.Generator().manual_seed(7), **kwargs)
    assert torch.equal(first.sequences, again.sequences)
    stats = first.spec_stats
    assert stats.new_tokens == 24 == sum(stats.accept_lengths) + stats.steps
    assert stats.reasons["ratio"] == stats.accepted and 0 < stats.alpha <= 1


def test_qwen_pair_easd_calibrated_default_penalises_and_never_emits_the_draft(qwen_pair):
    """EASD at the shipped 80th-percentile calibration (T=0.7) on a GSM8K prompt: every penalty
    replaces the draft token; at +inf thresholds the same seed gives standard SD's exact output."""
    from semverify import ModelDrafter, RunContext, Sampler, get_rule, speculative_generate
    from semverify.easd import EntropyAwareRule

    target, draft, tokenizer = qwen_pair
    ids = gsm8k_ids(tokenizer, 1)[0]
    context = RunContext("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", temperature=0.7)
    calibrated = get_rule("easd", context, percentile=80)
    seen = []

    def on_step(event):
        if event.verdict.reasons["penalty"].any():
            n = int(event.verdict.n_accepted)
            seen.append((int(event.verdict.next_token), int(event.draft.tokens[0, n])))

    def run(rule, **extra):
        return speculative_generate(target, ids, drafter=ModelDrafter(draft), rule=rule, k=5,
                                    max_new_tokens=64, sampler=Sampler(do_sample=True, temperature=0.7),
                                    generator=torch.Generator().manual_seed(3), **extra)

    _, stats = run(calibrated, on_step=on_step)
    assert stats.reasons["penalty"] == len(seen) > 0
    assert all(emitted != drafted for emitted, drafted in seen)
    assert torch.equal(run(get_rule("speculative"))[0], run(EntropyAwareRule(float("inf"), float("inf")))[0])


def test_smollm_sense_at_theta_one_matches_greedy(smollm, tmp_path):
    """SENSE (retrieval drafts on SmolLM2's own hidden states, soft gate at theta_e = 1) equals greedy
    decoding token for token in fp32; the datastore is built here from 40 GSM8K train solutions."""
    from semverify import get_rule, speculative_generate
    from semverify.sense import RetrievalDrafter, timed_build

    model, tokenizer = smollm
    examples = GSM8K().worked_examples(tokenizer, limit=40)
    store, info = timed_build(model, tokenizer, examples, tmp_path / "smol.pt", dim=64, model_name="smollm2")
    assert info["texts"] == 40 and info["entries"] > 2000
    for ids in gsm8k_ids(tokenizer, 2):
        expected = model.generate(ids, do_sample=False, max_new_tokens=48)
        out, stats = speculative_generate(model, ids, drafter=RetrievalDrafter(store),
                                          rule=get_rule("sense", theta_e=1.0), k=8, max_new_tokens=48)
        assert torch.equal(out, expected)
        assert stats.accepted > 0


def test_qwen_pair_semanticspec_with_the_shipped_probes(qwen_pair):
    """``rule="semanticspec"`` works out of the box on the default pair (a matched pair of probes shipped
    in the package, found by the models' names); at r_min > 1 it is the target's greedy output exactly."""
    from semverify.semanticspec import SemanticStepRule, find_probes

    target, draft, tokenizer = qwen_pair
    ids = gsm8k_ids(tokenizer, 1)[0]
    out = generate(target, ids, assistant_model=draft, tokenizer=tokenizer, rule="semanticspec",
                   max_new_tokens=96, return_dict_in_generate=True)
    reasons = out.spec_stats.reasons
    assert reasons["step"] + reasons["step_rejected"] > 0  # whole steps were drafted and judged
    probes = find_probes(draft.name_or_path, target.name_or_path)
    assert [p.hidden_size for p in probes] == [896, 1536]
    strict = SemanticStepRule(*probes, r_min=1.5)
    expected = target.generate(ids, do_sample=False, max_new_tokens=64)
    assert torch.equal(generate(target, ids, assistant_model=draft, tokenizer=tokenizer, rule=strict,
                                max_new_tokens=64), expected)
