"""After every step the target and draft caches hold exactly the accepted prefix."""

import pytest
import torch
from transformers import DynamicCache

from semverify.drafters import ModelDrafter
from semverify.engine.cache import UnsupportedCacheError, keep_first, new_cache
from semverify.engine.loop import speculative_generate
from semverify.engine.sampling import Sampler
from semverify.registry import get_rule
from tests.helpers import tiny_model


def fresh_keys(model, ids: torch.LongTensor) -> list[torch.Tensor]:
    """Layer keys of a cache built by one plain forward over ``ids``."""
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=ids, cache=cache, use_cache=True)
    return [layer.keys for layer in cache.layers]


@pytest.mark.parametrize("do_sample", [False, True])
def test_caches_hold_exactly_the_accepted_prefix(do_sample):
    target, draft = tiny_model(0), tiny_model(1)
    ids = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(0))
    events = []

    def check(event):
        seq = event.sequences
        assert event.target_cache.get_seq_length() == seq.shape[1] - 1
        for got, want in zip(event.target_cache.layers, fresh_keys(target, seq[:, :-1])):
            torch.testing.assert_close(got.keys, want, rtol=1e-5, atol=1e-5)
        d_cache = event.drafter.cache
        held = d_cache.get_seq_length()
        assert held <= seq.shape[1]
        for got, want in zip(d_cache.layers, fresh_keys(draft, seq[:, :held])):
            torch.testing.assert_close(got.keys, want, rtol=1e-5, atol=1e-5)
        events.append(int(event.verdict.n_accepted[0]))

    speculative_generate(target, ids, drafter=ModelDrafter(draft), rule=get_rule("speculative"),
                         k=4, max_new_tokens=40, sampler=Sampler(do_sample, 1.0),
                         generator=torch.Generator().manual_seed(1), on_step=check)
    assert len(events) > 5


def test_same_model_drafter_keeps_full_accepts():
    target = tiny_model(2)
    ids = torch.randint(0, 96, (1, 6), generator=torch.Generator().manual_seed(2))
    lengths = []
    speculative_generate(target, ids, drafter=ModelDrafter(target), rule=get_rule("greedy"), k=3,
                         max_new_tokens=12, on_step=lambda e: lengths.append(e.drafter.cache.get_seq_length()))
    # all 3 drafts accepted each step: the drafter holds the prefix + 2 drafts; the last draft token
    # and the bonus token are fed together at the next step
    assert lengths == [6 + 2, 10 + 2, 14 + 2]


def test_keep_first_edges():
    model = tiny_model(3)
    cache = new_cache(model)
    with torch.inference_mode():
        model(input_ids=torch.arange(8)[None], cache=cache, use_cache=True)
    keep_first(cache, 8)
    assert cache.get_seq_length() == 8
    keep_first(cache, 5)
    assert cache.get_seq_length() == 5
    with pytest.raises(ValueError):
        keep_first(cache, 6)
    with pytest.raises(ValueError):
        keep_first(cache, -1)
    keep_first(cache, 0)
    assert cache.get_seq_length() == 0


def test_sliding_window_model_rolls_back():
    """Full cache layers keep a sliding-window model croppable once the window is full."""
    target = tiny_model(4, sliding_window=8)
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(4))
    expected = target.generate(ids, do_sample=False, max_new_tokens=30)
    out, _ = speculative_generate(target, ids, drafter=ModelDrafter(tiny_model(5, sliding_window=8)),
                                  rule=get_rule("greedy"), k=4, max_new_tokens=30)
    assert torch.equal(out, expected)


def test_uncroppable_cache_is_refused(monkeypatch):
    monkeypatch.setattr(DynamicCache, "is_croppable", property(lambda self: False))
    with pytest.raises(UnsupportedCacheError, match="cannot be cropped"):
        new_cache(tiny_model(0), role="target model")


def test_holes_and_padding_take_no_slot_of_a_sliding_window():
    """A batch's rejected tokens (holes) and padding are masked out of a sliding window counted in token
    positions: before and after packing, each row's next logits are those of its own tokens alone."""
    from semverify.engine.cache import RowCache

    model = tiny_model(5, sliding_window=4)
    rows = [torch.arange(3, 9), torch.arange(20, 31)]
    ids = torch.stack([torch.cat([torch.zeros(5, dtype=torch.long), rows[0]]), rows[1]])
    valid = ids != 0
    cache = RowCache(model, 2)
    with torch.inference_mode():
        model(**cache.inputs(ids, valid))
        cache.extend(valid)
        model(**cache.inputs(torch.tensor([[11, 12, 13], [21, 22, 23]])))
        cache.extend(torch.ones(2, 3, dtype=torch.bool))
        cache.keep(torch.tensor([[True, False, False], [True, True, True]]))  # row 0 rejects 12, 13: holes
        alone = [torch.cat([rows[0], torch.tensor([11])]), torch.cat([rows[1], torch.tensor([21, 22, 23])])]
        for probe in (31, 32):
            got = model(**cache.inputs(torch.tensor([[probe], [probe]]))).logits[:, -1]
            cache.extend(torch.ones(2, 1, dtype=torch.bool))
            alone = [torch.cat([tokens, torch.tensor([probe])]) for tokens in alone]
            for row, tokens in enumerate(alone):
                torch.testing.assert_close(got[row], model(tokens[None]).logits[0, -1], rtol=1e-4, atol=1e-5)
            cache.pack()
