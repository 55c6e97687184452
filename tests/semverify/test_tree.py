"""Tree drafts: trie merging, the tree mask and positions, one-pass verification, KV compaction."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from semverify import Draft, PromptLookupDrafter, generate, get_rule
from semverify.engine.cache import UnsupportedCacheError, new_cache
from semverify.engine.loop import speculative_generate
from semverify.engine.tree import (
    ancestor_mask,
    depths,
    draft_from_sequences,
    keep_paths,
    leaf_paths,
    merge_sequences,
    tree_attention_mask,
    tree_position_ids,
)
from tests.helpers import TINY_VOCAB, tiny_model


def test_merge_shares_prefixes_and_drops_duplicates():
    tokens, parents = merge_sequences([[5, 6, 7], [5, 6, 9], [5, 8], [5, 6, 7], [4]])
    # sorted: [4], [5,6,7], [5,6,7], [5,6,9], [5,8]
    assert tokens == [4, 5, 6, 7, 9, 8]
    assert parents == [-1, -1, 1, 2, 2, 1]
    assert sorted(map(tuple, ([tokens[i] for i in p] for p in leaf_paths(torch.tensor(parents))))) == [
        (4,), (5, 6, 7), (5, 6, 9), (5, 8)]


def test_merge_prefix_of_another_and_single_chain():
    assert merge_sequences([[1, 2], [1, 2, 3]]) == ([1, 2, 3], [-1, 0, 1])
    assert merge_sequences([]) == ([], [])
    chain = draft_from_sequences([[3, 4, 5], [3, 4]])
    assert not chain.is_tree and chain.tokens.tolist() == [[3, 4, 5]]
    tree = draft_from_sequences([[3, 4], [3, 5]])
    assert tree.is_tree and tree.parents.tolist() == [-1, 0, 0]
    assert draft_from_sequences([[], []]).length == 0


def test_depths_ancestors_and_paths():
    parents = torch.tensor([-1, 0, 1, 0, -1, 4])
    assert depths(parents).tolist() == [1, 2, 3, 2, 1, 2]
    anc = ancestor_mask(parents)
    assert anc[2].nonzero().flatten().tolist() == [0, 1, 2]
    assert anc[5].nonzero().flatten().tolist() == [4, 5]
    assert leaf_paths(parents) == [[0, 1, 2], [0, 3], [4, 5]]


def test_mask_and_positions_with_unseen_context():
    parents = torch.tensor([-1, 0, -1])
    mask = tree_attention_mask(parents, past=2, unseen=2, dtype=torch.float32)[0, 0] == 0
    expected = torch.tensor([
        # cache  ctx   nodes
        [1, 1, 1, 0, 0, 0, 0],  # first unseen token: causal
        [1, 1, 1, 1, 0, 0, 0],  # root
        [1, 1, 1, 1, 1, 0, 0],  # node 0
        [1, 1, 1, 1, 1, 1, 0],  # node 1 (child of 0)
        [1, 1, 1, 1, 0, 0, 1],  # node 2 (sibling of 0)
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)
    assert tree_position_ids(parents, past=2, unseen=2).tolist() == [[2, 3, 4, 5, 4]]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("past", [0, 7])
def test_tree_logits_equal_branch_by_branch_logits(arch, past):
    model = tiny_model(0, arch)
    g = torch.Generator().manual_seed(1)
    context = torch.randint(0, TINY_VOCAB, (1, 12), generator=g)
    branches = [[3, 4, 5, 6], [3, 4, 9], [3, 8], [11, 12, 13]]
    tokens, parents = merge_sequences(branches)
    parents_t = torch.tensor(parents)
    with torch.inference_mode():
        cache = new_cache(model)
        if past:
            model(input_ids=context[:, :past], cache=cache, use_cache=True)
        pending = context.shape[1] - past
        out = model(input_ids=torch.cat([context[:, past:], torch.tensor([tokens])], 1), cache=cache,
                    use_cache=True, attention_mask=tree_attention_mask(parents_t, past, pending, model.dtype),
                    position_ids=tree_position_ids(parents_t, past, pending)).logits[0, -(len(tokens) + 1):]
        for path in leaf_paths(parents_t):
            alone = model(input_ids=torch.cat([context, torch.tensor([[tokens[i] for i in path]])], 1)).logits[0]
            rows = [0] + [i + 1 for i in path]
            assert torch.allclose(out[rows], alone[-(len(path) + 1):], atol=1e-5), path


def test_keep_paths_moves_the_chosen_branch_and_refuses_dropping_caches():
    model = tiny_model(0)
    cache = new_cache(model)
    with torch.inference_mode():
        model(input_ids=torch.arange(10)[None], cache=cache, use_cache=True)
        before = cache.layers[0].keys.clone()
        keep_paths(cache, 4, [[2, 5]])
    after = cache.layers[0].keys
    assert torch.equal(after[:, :, 4], before[:, :, 6]) and torch.equal(after[:, :, 5], before[:, :, 9])
    assert torch.equal(after[:, :, :4], before[:, :, :4])

    # a sliding-window model's cache keeps full layers (its window is a mask), so a path moves there too
    sliding = tiny_model(0, sliding_window=4)
    cache = new_cache(sliding)
    with torch.inference_mode():
        sliding(input_ids=torch.arange(10)[None], cache=cache, use_cache=True)
        before = cache.layers[0].keys.clone()
        keep_paths(cache, 4, [[2, 5]])
    assert torch.equal(cache.layers[0].keys[:, :, 5], before[:, :, 9])
    # transformers' own sliding layers drop columns: a path cannot be moved in them
    dropping = DynamicCache(config=sliding.config)
    with torch.inference_mode(), pytest.raises(UnsupportedCacheError, match="full"):
        sliding(input_ids=torch.arange(10)[None], cache=dropping, use_cache=True)
        keep_paths(dropping, 4, [[2, 5]])



def test_keep_paths_moves_each_rows_own_branch():
    model = tiny_model(0)
    cache = new_cache(model)
    with torch.inference_mode():
        model(input_ids=torch.arange(30).reshape(3, 10), cache=cache, use_cache=True)
        before = cache.layers[0].keys.clone()
        keep_paths(cache, 4, [[2, 5], [0, 1], [3]])
    after = cache.layers[0].keys
    assert torch.equal(after[0, :, 4:6], before[0, :, [6, 9]])
    assert torch.equal(after[1], before[1])  # a chain's prefix stays in place
    assert torch.equal(after[2, :, 4], before[2, :, 7]) and torch.equal(after[:, :, :4], before[:, :, :4])

class OracleTreeDrafter(PromptLookupDrafter):
    """Proposes the target's true greedy continuation cut at a random depth, hidden among decoys that
    share its prefix or not: tests that the loop picks the right branch and compacts the cache."""

    def __init__(self, reference: torch.LongTensor, seed: int):
        super().__init__()
        self.reference = reference[0].tolist()
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, input_ids, k, sampler=None, generator=None) -> Draft:
        at = input_ids.shape[1]
        truth = self.reference[at:at + k]
        cut = int(torch.randint(0, len(truth) + 1, (1,), generator=self.g)) if truth else 0
        rand = lambda n: torch.randint(0, TINY_VOCAB, (n,), generator=self.g).tolist()  # noqa: E731
        candidates = [truth[:cut], rand(k), truth[:1] + rand(k - 1), truth[:2] + rand(max(k - 2, 0))]
        return draft_from_sequences([c[:k] for c in candidates])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rule", ["greedy", "speculative", "typical"])
def test_tree_loop_equals_greedy_target(arch, seed, rule):
    target = tiny_model(seed, arch)
    ids = torch.randint(0, TINY_VOCAB, (1, 9), generator=torch.Generator().manual_seed(seed))
    expected = target.generate(ids, do_sample=False, max_new_tokens=40)
    params = {"posterior_threshold": 1.0, "posterior_alpha": float("inf")} if rule == "typical" else {}
    out, stats = speculative_generate(target, ids, drafter=OracleTreeDrafter(expected, seed),
                                      rule=get_rule(rule, **params), k=5, max_new_tokens=40)
    assert torch.equal(out, expected)
    assert stats.accepted > 0 and stats.drafted > stats.accepted
    assert len(stats.drafted_per_position) <= 5


def test_generate_accepts_a_tree_drafter():
    target = tiny_model(4)
    ids = torch.randint(0, TINY_VOCAB, (1, 9), generator=torch.Generator().manual_seed(4))
    expected = target.generate(ids, do_sample=False, max_new_tokens=24)
    out = generate(target, ids, drafter=OracleTreeDrafter(expected, 4), max_new_tokens=24, num_assistant_tokens=4,
                   return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected) and out.spec_stats.tau > 1
