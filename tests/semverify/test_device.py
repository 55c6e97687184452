"""On a CUDA device (skipped where there is none, as on CI machines; `scripts/gpu-check.sh` runs them on a lent
GPU): every drafter's path keeps its tensors on the model's device, float32 greedy outputs equal transformers'
`generate` on that device (batch 1 and a left-padded batch), and coupled sampling gives the target alone's
tokens whatever the drafter, as on the CPU."""

from __future__ import annotations

import pytest
import torch

from semverify import CoupledNoise, ModelTreeDrafter, generate
from tests.helpers import tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DRAFTING = {"draft model": lambda draft: dict(assistant_model=draft),
            "prompt lookup": lambda draft: dict(prompt_lookup_num_tokens=3),
            "draft tree": lambda draft: dict(drafter=ModelTreeDrafter(draft, budget=8, branch=2, threshold=1.0)),
            "none": lambda draft: {}}


def pair(seed: int = 0):
    return tiny_model(seed, arch="llama").cuda(), tiny_model(seed + 10, arch="llama").cuda()


@pytest.mark.parametrize("drafting", list(DRAFTING))
def test_greedy_float32_equals_generate_on_the_device(drafting):
    target, draft = pair()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]], device="cuda")
    out = generate(target, ids, max_new_tokens=24, num_assistant_tokens=4, return_dict_in_generate=True,
                   **DRAFTING[drafting](draft))
    expected = target.generate(ids, max_new_tokens=24, do_sample=False)
    assert out.sequences.device.type == "cuda" and torch.equal(out.sequences, expected)
    assert out.spec_stats.new_tokens == 24


@pytest.mark.parametrize("drafting", list(DRAFTING))
def test_greedy_float32_batch_equals_generate_on_the_device(drafting):
    target, draft = pair(1)
    ids = torch.tensor([[0, 0, 0, 7, 2, 9, 4], [5, 1, 8, 2, 6, 3, 3], [0, 0, 0, 0, 0, 4, 4]], device="cuda")
    mask = (torch.arange(7, device="cuda")[None, :] >= torch.tensor([[3], [0], [5]], device="cuda")).long()
    out = generate(target, ids, attention_mask=mask, max_new_tokens=20, pad_token_id=0, num_assistant_tokens=4,
                   **DRAFTING[drafting](draft))
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(out, expected)


def test_coupled_sampling_gives_the_target_alone_tokens_for_every_drafter_on_the_device():
    target, draft = pair(2)
    ids = torch.tensor([[0, 5, 9, 4, 7]], device="cuda")
    sampled = dict(do_sample=True, temperature=0.8, max_new_tokens=30, num_assistant_tokens=4)
    expected = generate(target, ids, generator=CoupledNoise(5), **sampled)
    for name, drafting in DRAFTING.items():
        out = generate(target, ids, generator=CoupledNoise(5), **sampled, **drafting(draft))
        assert torch.equal(out, expected), name


def test_sampled_decoding_draws_from_a_generator_on_the_device():
    target, draft = pair(3)
    ids = torch.tensor([[2, 7, 1, 8, 2, 8]], device="cuda")
    runs = [generate(target, ids, assistant_model=draft, do_sample=True, max_new_tokens=16,
                     generator=torch.Generator("cuda").manual_seed(4)) for _ in range(2)]
    assert runs[0].device.type == "cuda" and torch.equal(runs[0], runs[1])


def test_a_batch_of_step_drafts_rejecting_every_step_is_target_decoding_on_the_device():
    from semverify.semanticspec import StepDrafter, StepLikelihood, StepSegmenter
    from tests.helpers import byte_tokenizer

    tok = byte_tokenizer()
    target, draft = (tiny_model(s, arch="llama", vocab=len(tok)).cuda() for s in (0, 20))
    ids = torch.tensor([[0, 0, 5, 9, 4, 7], [3, 1, 4, 1, 5, 9]], device="cuda")
    mask = (ids != 0).long()
    drafter = StepDrafter(draft, StepSegmenter(tok, stops=(" ", "e"), max_step_tokens=6), token_k=3,
                          target_first_step=False)
    out = generate(target, ids, attention_mask=mask, drafter=drafter, rule=StepLikelihood(min_mean_logprob=0.1),
                   num_assistant_tokens=6, max_new_tokens=20, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert out.device.type == "cuda" and torch.equal(out, expected)
