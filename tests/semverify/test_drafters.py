"""Drafters on hand-built sequences: what prompt lookup proposes, and the model drafter's bookkeeping."""

import torch

from semverify import ModelDrafter, PromptLookupDrafter, Sampler
from tests.helpers import tiny_model


def proposal(drafter, seq, k):
    return drafter.propose(torch.tensor([seq]), k).tokens[0].tolist()


def test_prompt_lookup_recent_and_first():
    seq = [5, 6, 1, 2, 7, 5, 6, 3, 4, 9, 5, 6]
    assert proposal(PromptLookupDrafter(2, prefer="recent"), seq, 3) == [3, 4, 9]
    assert proposal(PromptLookupDrafter(2, prefer="first"), seq, 3) == [1, 2, 7]


def test_prompt_lookup_prefers_longer_ngrams_and_caps_length():
    seq = [1, 2, 3, 8, 8, 2, 3, 9, 1, 2, 3]  # the 3-gram [1,2,3] wins over the later 2-gram [2,3]
    assert proposal(PromptLookupDrafter(3), seq, 2) == [8, 8]
    assert proposal(PromptLookupDrafter(2), seq, 2) == [9, 1]


def test_prompt_lookup_stops_after_eos_and_handles_no_match():
    seq = [4, 5, 0, 6, 7, 4, 5]
    assert proposal(PromptLookupDrafter(2, eos_token_id=0), seq, 4) == [0]
    assert proposal(PromptLookupDrafter(2), [1, 2, 3, 4], 4) == []
    assert proposal(PromptLookupDrafter(2), [7], 4) == []
    assert PromptLookupDrafter().propose(torch.tensor([[1, 2, 1]]), 3).probs is None


def test_model_drafter_gives_the_distribution_it_sampled_from():
    model = tiny_model(0, vocab=16, init_std=0.5)
    drafter = ModelDrafter(model)
    ids = torch.tensor([[1, 2, 3]])
    drafter.reset(ids)
    sampler = Sampler(True, 0.8, top_k=4)
    draft = drafter.propose(ids, 3, sampler, torch.Generator().manual_seed(0))
    assert draft.tokens.shape == (1, 3) and draft.probs.shape == (1, 3, 16)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(1, 3))
    assert ((draft.probs > 0).sum(-1) <= 4).all()  # the same top-k warp the target gets
    with torch.inference_mode():
        expected = sampler.probs(model(ids).logits[:, -1])
    torch.testing.assert_close(draft.probs[:, 0], expected)
    assert draft.probs[0, torch.arange(3), draft.tokens[0]].gt(0).all()


def test_model_drafter_stops_after_eos():
    model = tiny_model(0, vocab=16, init_std=0.5)
    ids = torch.tensor([[1, 2, 3]])
    greedy = ModelDrafter(model, eos_token_id=[])
    greedy.reset(ids)
    free = greedy.propose(ids, 4, Sampler(), None).tokens[0].tolist()
    drafter = ModelDrafter(model, eos_token_id=free[1])
    drafter.reset(ids)
    assert drafter.propose(ids, 4, Sampler(), None).tokens[0].tolist() == free[: free.index(free[1]) + 1]
