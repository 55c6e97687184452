"""The generate() wrapper: transformers-style arguments, outputs, streaming and seeding."""

import torch
from transformers import GenerationConfig

from semverify import SpecGenerateOutput, TypicalAcceptance, generate
from tests.helpers import tiny_model

IDS = torch.arange(12)[None] % 7


class Collect:
    """A minimal streamer: records every put() call."""

    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.clone())

    def end(self):
        self.ended = True


def test_dict_output_carries_stats():
    target = tiny_model(0)
    out = generate(target, IDS, assistant_model=target, num_assistant_tokens=3, max_new_tokens=10,
                   assistant_confidence_threshold=0.0, return_dict_in_generate=True)
    assert isinstance(out, SpecGenerateOutput)
    stats = out.spec_stats
    assert stats.new_tokens == 10 == out.sequences.shape[1] - IDS.shape[1]
    assert stats.accepted == stats.drafted and stats.reasons["exact"] == stats.accepted
    assert stats.tau == 10 / stats.steps and stats.acceptance_by_position == [1.0, 1.0, 1.0]
    d = stats.to_dict()
    assert d["tokens_per_second"] > 0 and d["total_time"] >= d["draft_time"] + d["verify_time"]


def test_confidence_threshold_stops_drafts_early():
    target = tiny_model(0)  # near-uniform random model: the draft's top probability is far below 0.4
    out = generate(target, IDS, assistant_model=target, num_assistant_tokens=3, max_new_tokens=10,
                   return_dict_in_generate=True)
    assert out.spec_stats.drafted_per_position == [out.spec_stats.steps]


def test_streamer_gets_prompt_then_every_token():
    target = tiny_model(1)
    streamer = Collect()
    out = generate(target, IDS, prompt_lookup_num_tokens=4, max_new_tokens=9, streamer=streamer)
    assert torch.equal(streamer.chunks[0], IDS) and streamer.ended
    assert torch.equal(torch.cat([c[0] for c in streamer.chunks]), out[0])


def test_generation_config_object_is_honoured():
    target = tiny_model(2)
    config = GenerationConfig(max_new_tokens=6, do_sample=False)
    assert generate(target, IDS, generation_config=config).shape[1] == IDS.shape[1] + 6
    assert torch.equal(generate(target, input_ids=IDS, max_new_tokens=6),
                       target.generate(IDS, max_new_tokens=6, do_sample=False))


def test_draft_length_from_a_generation_config():
    target = tiny_model(2)
    config = GenerationConfig(max_new_tokens=12, num_assistant_tokens=2, assistant_confidence_threshold=0.0)
    out = generate(target, IDS, assistant_model=target, generation_config=config, return_dict_in_generate=True)
    assert out.spec_stats.drafted_per_position[2:] == [] and out.spec_stats.drafted_per_position[1] > 0


def test_seeded_sampling_repeats():
    target, draft = tiny_model(3), tiny_model(4)
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(generate(target, IDS, assistant_model=draft, do_sample=True, temperature=0.9, top_k=20,
                             max_new_tokens=20))
    assert torch.equal(runs[0], runs[1])
    g = torch.Generator().manual_seed(5)
    a = generate(target, IDS, do_sample=True, max_new_tokens=20, generator=g)
    assert torch.equal(a, generate(target, IDS, do_sample=True, max_new_tokens=20,
                                   generator=torch.Generator().manual_seed(5)))


def test_typical_at_its_lossless_limit_is_greedy():
    target, draft = tiny_model(5), tiny_model(6)
    rule = TypicalAcceptance(posterior_threshold=1.0, posterior_alpha=float("inf"))
    expected = target.generate(IDS, do_sample=False, max_new_tokens=30)
    assert torch.equal(generate(target, IDS, assistant_model=draft, rule=rule, max_new_tokens=30), expected)


def test_typical_accepts_more_than_exact_on_a_peaked_random_pair():
    target, draft = tiny_model(7, init_std=0.3), tiny_model(8, init_std=0.3)
    kw = dict(assistant_model=draft, num_assistant_tokens=4, max_new_tokens=60, return_dict_in_generate=True)
    exact = generate(target, IDS, **kw).spec_stats
    loose = generate(target, IDS, rule=TypicalAcceptance(0.3, 0.9), **kw).spec_stats
    assert loose.alpha > exact.alpha and loose.reasons["typical"] > 0


def test_a_window_rule_drafts_its_window_by_default_and_refuses_shorter_drafts():
    """FLy's window of 6 never fires on 5-token drafts: generate() drafts 6 for it unless told, and refuses fewer."""
    import pytest

    target = tiny_model(0)
    out = generate(target, IDS, assistant_model=target, rule="fly", max_new_tokens=12, return_dict_in_generate=True,
                   assistant_confidence_threshold=0.0)
    assert max(out.spec_stats.draft_lengths) == 6
    with pytest.raises(ValueError, match="at least 6 tokens"):
        generate(target, IDS, assistant_model=target, rule="fly", num_assistant_tokens=5, max_new_tokens=4)
