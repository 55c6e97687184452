"""The draft-length planner: it never drafts where a draft cannot pay for itself, drafts long where verification
is cheap and acceptance high, probes while it decodes plainly, and never changes a greedy float32 output."""

from __future__ import annotations

import pytest
import torch

from semverify import ModelDrafter, generate
from semverify.cost import cost_file, forward_costs
from semverify.planner import DraftPlanner
from tests.helpers import tiny_model

LINEAR = {n: 1.0 + n for n in range(9)}  # wide forwards cost as many one-token forwards as tokens (bf16, AVX2)
FLAT = {n: 1.0 + 0.02 * n for n in range(9)}  # a wide forward costs about one (a GPU, AMX)


def fed(planner: DraftPlanner, drafted: int, accepted: int, times: int) -> DraftPlanner:
    for _ in range(times):
        planner.update(drafted, accepted)
    return planner


def test_plain_decoding_where_wide_forwards_cost_linearly_even_at_full_acceptance():
    planner = DraftPlanner(LINEAR, draft_cost=0.5, k_max=8)
    assert planner.best() == 0
    assert fed(planner, 8, 8, 200).acceptance()[0] > 0.95 and planner.best() == 0


def test_long_drafts_where_verification_is_cheap_and_acceptance_high():
    planner = fed(DraftPlanner(FLAT, draft_cost=0.05, k_max=8), 8, 6, 100)
    assert planner.best() >= 4
    assert planner.expected_tokens(3) == pytest.approx(1 + sum(planner.acceptance()[0] ** i for i in (1, 2, 3)),
                                                       rel=0.05)
    poor = fed(DraftPlanner(FLAT, draft_cost=0.05, k_max=8), 8, 0, 100)  # nothing is ever kept
    assert poor.best() == 0


def test_positions_never_drafted_borrow_the_acceptance_of_the_last_drafted_one():
    """Measured on an AVX512-BF16 EPYC: verification nearly flat, a draft step 0.37 of a target step. A planner
    that only drafted one token, always kept, must still see that longer drafts pay."""
    costs = {0: 1.0, 1: 1.02, 2: 1.04, 4: 1.08, 8: 1.2}
    planner = fed(DraftPlanner(costs, draft_cost=0.37, k_max=8), 1, 1, 100)
    assert planner.tried[1:] == [0] * 7 and min(planner.acceptance()) > 0.9
    assert planner.best() >= 4
    refused = fed(DraftPlanner(costs, draft_cost=0.37, k_max=8), 1, 0, 100)
    assert max(refused.acceptance()) < 0.05 and refused.best() == 0


def test_a_dip_in_the_measured_curve_counts_as_noise():
    """Measured on the AVX512-BF16 EPYC (4 repeats): a forward over 1 draft token at 0.74 of a one-token forward."""
    planner = DraftPlanner({0: 0.306, 1: 0.227, 2: 0.275, 4: 0.324, 8: 0.321}, draft_cost=0.113, k_max=8)
    assert planner.verify == pytest.approx({0: 1.0, 1: 1.0, 2: 1.0, 4: 1.059, 8: 1.059}, abs=1e-3)


def test_costs_are_relative_to_the_one_token_forward_and_interpolated():
    planner = DraftPlanner({0: 0.2, 4: 0.4, 8: 1.0}, draft_cost=0.1, k_max=8)
    assert planner.step_cost(0) == 1.0 and planner.step_cost(2) == pytest.approx(2 * 0.5 + 1.5)


def test_update_counts_positions_reached_and_kept():
    planner = DraftPlanner(FLAT, draft_cost=0.1, k_max=5)
    planner.update(4, 2)  # tokens 1 and 2 kept, token 3 refused, token 4 never judged
    assert planner.tried == [1, 1, 1, 0, 0] and planner.kept == [1, 1, 0, 0, 0]


def test_probes_at_doubling_intervals_while_decoding_plainly_where_a_draft_could_pay():
    planner = fed(DraftPlanner(FLAT, draft_cost=0.05, k_max=8, probe_every=4, probe=2), 8, 0, 50)
    assert planner.best() == 0 and planner.could_pay()
    choices = [planner.choose() for _ in range(28)]
    assert [i for i, k in enumerate(choices) if k] == [3, 11, 27]  # after 4, 8 and 16 plain steps
    hopeless = DraftPlanner(LINEAR, draft_cost=0.5, k_max=8, probe_every=4)
    assert not hopeless.could_pay() and not any(hopeless.choose() for _ in range(100))
    with pytest.raises(ValueError, match="one-token forward"):
        DraftPlanner({1: 1.0}, draft_cost=0.1, k_max=4)


@pytest.mark.parametrize("costs", [LINEAR, FLAT, "probing"])
def test_a_planned_drafter_leaves_greedy_outputs_unchanged(costs):
    target, draft = tiny_model(4, arch="llama"), tiny_model(14, arch="llama")
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    planner = DraftPlanner(LINEAR if costs is LINEAR else FLAT, draft_cost=0.5 if costs is LINEAR else 0.05, k_max=6,
                           probe_every=3)
    if costs == "probing":  # nothing was ever kept: plain steps, and probes that catch the draft model up
        fed(planner, 6, 0, 100).update = lambda drafted, accepted: None
    out = generate(target, ids, drafter=ModelDrafter(draft, planner=planner), num_assistant_tokens=6,
                   max_new_tokens=30, return_dict_in_generate=True)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=30, do_sample=False))
    lengths = out.spec_stats.draft_lengths  # the shapes chosen, step by step, are in the statistics
    if costs is LINEAR:
        assert set(lengths) == {0}  # no draft could pay for itself, so none is made, not even a probe
    elif costs == "probing":
        assert set(lengths) == {0, 2} and lengths[2] == 2 and lengths[3] == 0  # a probe after 3 plain steps
    else:
        assert max(lengths) >= 3 and lengths[:-1].count(0) == 0  # (the last step may have no budget left)


@pytest.mark.parametrize("costs", [LINEAR, FLAT], ids=["linear", "flat"])
def test_a_planned_drafter_in_a_batch_equals_generate(costs):
    target, draft = tiny_model(5, arch="llama"), tiny_model(15, arch="llama")
    ids = torch.tensor([[0, 0, 7, 2, 9, 4], [5, 1, 8, 2, 6, 3]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    planner = DraftPlanner(costs, draft_cost=0.05, k_max=5, probe_every=2)
    out = generate(target, ids, attention_mask=mask, pad_token_id=0, max_new_tokens=20,
                   drafter=ModelDrafter(draft, planner=planner), num_assistant_tokens=5)
    assert torch.equal(out, target.generate(ids, attention_mask=mask, pad_token_id=0, max_new_tokens=20,
                                            do_sample=False))


def test_forward_costs_are_measured_once_and_cached_per_machine(tmp_path, monkeypatch):
    import semverify.cost

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path))
    model = tiny_model(6, arch="llama")
    calls = []
    real = semverify.cost.forward_seconds
    monkeypatch.setattr(semverify.cost, "forward_seconds", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    first = forward_costs(model, (0, 2, 4), repeats=1, context=16, progress=False)
    again = forward_costs(model, (0, 2, 4), repeats=1, context=16, progress=False)
    assert calls == [(0, 2, 4)] and first == again and set(first) == {0, 2, 4} and min(first.values()) > 0
    path = cost_file(model)
    assert path.is_file() and path.parent == tmp_path / "forward-cost"
    assert cost_file(model.to(torch.bfloat16)) != path  # another dtype is another curve


def test_num_assistant_tokens_auto_plans_and_stays_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path))
    target, draft = tiny_model(7, arch="llama"), tiny_model(17, arch="llama")
    ids = torch.tensor([[2, 7, 1, 8, 2, 8]])
    out = generate(target, ids, assistant_model=draft, num_assistant_tokens="auto", max_new_tokens=20,
                   return_dict_in_generate=True)
    assert torch.equal(out.sequences, target.generate(ids, max_new_tokens=20, do_sample=False))
    assert (tmp_path / "forward-cost").is_dir() and max(out.spec_stats.draft_lengths) <= 8
    with pytest.raises(ValueError, match="plans a draft model"):
        generate(target, ids, num_assistant_tokens="auto", max_new_tokens=4)
