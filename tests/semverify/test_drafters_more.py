"""Draft-model trees, adaptive draft lengths and the hybrid drafter: lossless under greedy verification
(fp32, token for token against model.generate), and each doing what it is for."""

from __future__ import annotations

import pytest
import torch

from semverify import HybridDrafter, ModelDrafter, ModelTreeDrafter, PromptLookupDrafter, generate, get_rule
from semverify.engine.loop import speculative_generate
from semverify.engine.sampling import Sampler
from tests.helpers import tiny_model


def setup(seed: int):
    target, draft = tiny_model(seed, arch="llama"), tiny_model(seed + 30, arch="llama")
    ids = torch.randint(1, 96, (1, 12), generator=torch.Generator().manual_seed(seed))
    return target, draft, ids


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("budget, branch", [(6, 2), (16, 3)])
def test_draft_model_trees_equal_greedy_target(seed, budget, branch):
    target, draft, ids = setup(seed)
    expected = target.generate(ids, do_sample=False, max_new_tokens=40)
    drafter = ModelTreeDrafter(draft, budget=budget, branch=branch, threshold=0.9)
    trees = []
    out, stats = speculative_generate(target, ids, drafter=drafter, rule=get_rule("greedy"), k=5,
                                      max_new_tokens=40, on_step=lambda e: trees.append(e.draft.is_tree))
    assert torch.equal(out, expected) and any(trees)  # unsure random drafts branch
    assert max(stats.drafted_per_position or [0]) > 0


def test_a_tree_of_the_target_itself_accepts_whole_paths_and_keeps_its_cache_in_step():
    target, _, ids = setup(3)
    drafter = ModelTreeDrafter(target, budget=30, branch=2, threshold=0.9)  # room for 2 + 4 + 8 + 16 nodes
    out, stats = speculative_generate(target, ids, drafter=drafter, rule=get_rule("greedy"), k=4,
                                      max_new_tokens=30)
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=30))
    assert stats.accept_lengths[:5] == [4] * 5  # the argmax path is always in the tree, to its full depth
    assert drafter.fed[0] <= out.shape[1]  # the cache rolls back to the accepted path at the next draft
    assert drafter.rows.length <= drafter.fed[0] + drafter.budget  # no more than the last tree beyond it
    # sampled: a node is kept with the target's probability of its token, so at a low temperature a tree of
    # the target itself still gives long paths
    g = torch.Generator().manual_seed(0)
    out, stats = speculative_generate(target, ids, drafter=ModelTreeDrafter(target, budget=30, branch=2, threshold=0.9),
                                      rule=get_rule("speculative"), k=4, max_new_tokens=30,
                                      sampler=Sampler(do_sample=True, temperature=0.05), generator=g)
    assert out.shape[1] == ids.shape[1] + 30 and stats.tau > 1.5


def test_adaptive_draft_length_grows_after_full_accepts_and_shrinks_after_rejections():
    target, draft, ids = setup(4)
    same = ModelDrafter(target, adaptive=True, start=2)  # the target drafting for itself: every draft is accepted
    out, stats = speculative_generate(target, ids, drafter=same, rule=get_rule("greedy"), k=10,
                                      max_new_tokens=40)
    assert stats.accept_lengths[:4] == [2, 4, 6, 8] and torch.equal(
        out, target.generate(ids, do_sample=False, max_new_tokens=40))
    other = ModelDrafter(draft, adaptive=True, start=6)
    _, stats = speculative_generate(target, ids, drafter=other, rule=get_rule("greedy"), k=10,
                                    max_new_tokens=40)
    assert min(len_ for len_ in stats.accept_lengths) >= 0 and other.lengths[0] < 6  # rejections shrink it
    heuristic = generate(target, ids, assistant_model=draft, num_assistant_tokens_schedule="heuristic",
                         max_new_tokens=40)
    assert torch.equal(heuristic, target.generate(ids, do_sample=False, max_new_tokens=40))


def test_entropy_stop_ends_drafts_where_the_draft_is_unsure():
    target, draft, ids = setup(5)
    flat = ModelDrafter(draft, entropy_stop=0.0)  # every random draft distribution is above 0 nats
    _, stats = speculative_generate(target, ids, drafter=flat, rule=get_rule("greedy"), k=5,
                                    max_new_tokens=20)
    assert len(stats.drafted_per_position) == 1 and stats.drafted <= stats.steps  # one token, then it stops


def test_hybrid_drafts_by_lookup_when_the_text_repeats_and_by_the_model_otherwise():
    target, draft, _ = setup(6)
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
    hybrid = HybridDrafter(ModelDrafter(draft), PromptLookupDrafter(2), min_tokens=2)
    out, stats = speculative_generate(target, ids, drafter=hybrid, rule=get_rule("speculative"), k=5,
                                      max_new_tokens=30)
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=30))
    assert 0 < hybrid.looked_up < stats.steps  # some steps by lookup, some by the model
    with pytest.raises(ValueError, match="min_tokens"):
        HybridDrafter(ModelDrafter(draft), min_tokens=0)


def test_new_methods_are_presets():
    from semverify.methods import get_method

    assert get_method("sd_tree").drafter == "model_tree" and get_method("sd_tree").rule == "speculative"
    assert get_method("sd_adaptive").drafter_params == {"adaptive": True} and get_method("hybrid").drafter == "hybrid"
