"""Greedy speculative decoding must equal greedy target decoding token for token (fp32)."""

import pytest
import torch

from semverify import generate
from semverify.drafters import ModelDrafter, PromptLookupDrafter
from semverify.engine.loop import speculative_generate
from semverify.registry import get_rule
from tests.helpers import TINY_VOCAB, tiny_model


def repetitive_prompt(seed: int, length: int = 24) -> torch.LongTensor:
    """A prompt with repeats, so prompt lookup finds matches."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, TINY_VOCAB, (length // 3,), generator=g)
    return torch.cat([base, base, torch.randint(0, TINY_VOCAB, (length - 2 * len(base),), generator=g)])[None]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("drafter_kind", ["same", "random", "prompt_lookup", "prompt_lookup_first"])
@pytest.mark.parametrize("rule", ["greedy", "speculative"])
def test_matches_greedy_target(arch, seed, k, drafter_kind, rule):
    target = tiny_model(seed, arch)
    ids = repetitive_prompt(seed)
    expected = target.generate(ids, do_sample=False, max_new_tokens=48)
    drafter = {
        "same": lambda: ModelDrafter(target),
        "random": lambda: ModelDrafter(tiny_model(seed + 100, arch)),
        "prompt_lookup": lambda: PromptLookupDrafter(max_ngram_size=2),
        "prompt_lookup_first": lambda: PromptLookupDrafter(max_ngram_size=3, prefer="first"),
    }[drafter_kind]()
    out, stats = speculative_generate(target, ids, drafter=drafter, rule=get_rule(rule),
                                      k=k, max_new_tokens=48)
    assert torch.equal(out, expected)
    assert stats.new_tokens == 48
    if drafter_kind == "same":
        assert stats.alpha == 1.0 and stats.tau == pytest.approx(48 / stats.steps)


def test_generate_wrapper_matches_model_generate():
    target, draft = tiny_model(3), tiny_model(4)
    ids = repetitive_prompt(3)
    expected = target.generate(ids, do_sample=False, max_new_tokens=30)
    for kwargs in ({"assistant_model": draft, "num_assistant_tokens": 3},
                   {"prompt_lookup_num_tokens": 5}, {}):
        assert torch.equal(generate(target, ids, max_new_tokens=30, **kwargs), expected), kwargs


def test_eos_stops_like_transformers():
    target = tiny_model(5)
    ids = repetitive_prompt(5)
    free = target.generate(ids, do_sample=False, max_new_tokens=30)
    eos = int(free[0, ids.shape[1] + 7])  # a token the greedy output emits at step 8 (or earlier)
    expected = target.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=eos, pad_token_id=eos)
    out = generate(target, ids, assistant_model=target, num_assistant_tokens=4, max_new_tokens=30, eos_token_id=eos)
    assert torch.equal(out, expected)
    assert int(out[0, -1]) == eos and out.shape[1] <= ids.shape[1] + 8


def test_draft_tokens_after_eos_are_not_counted_as_accepted():
    target = tiny_model(5)
    ids = repetitive_prompt(5)
    free = target.generate(ids, do_sample=False, max_new_tokens=30)
    eos = int(free[0, ids.shape[1] + 2])
    # a drafter blind to EOS drafts past it; the loop must cut the counts where the output ends
    out, stats = speculative_generate(target, ids, drafter=ModelDrafter(target, eos_token_id=[]),
                                      rule=get_rule("greedy"), k=8, max_new_tokens=30, eos_token_id=eos)
    assert int(out[0, -1]) == eos
    assert stats.new_tokens == out.shape[1] - ids.shape[1] <= 3
    assert stats.accepted <= stats.new_tokens and stats.drafted == 8
    assert all(len(v) <= stats.new_tokens for v in stats.reasons_per_position.values())


def test_max_new_tokens_is_exact_for_every_k():
    target = tiny_model(6)
    ids = repetitive_prompt(6)
    for max_new in (1, 2, 7):
        out = generate(target, ids, assistant_model=target, num_assistant_tokens=5, max_new_tokens=max_new)
        assert out.shape[1] == ids.shape[1] + max_new
