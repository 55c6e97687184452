"""Batches: left-padded rows, each with its own accepted lengths, EOS and random stream.

Greedy fp32 rows equal transformers' batched ``generate`` on the same padded batch and their own
batch-1 outputs; sampled rows draw what they draw alone, and follow the target's distribution.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from semverify import Sampler, SpeculativeSampling, Verdict, generate
from semverify.drafters import HybridDrafter, ModelDrafter, ModelTreeDrafter, PromptLookupDrafter
from semverify.engine.cache import RowCache
from semverify.engine.loop import speculative_generate
from semverify.engine.noise import sample_from
from semverify.registry import get_rule
from semverify.rules import prefix_mask
from tests.helpers import tiny_model


def left_padded(rows: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.full((width - len(r),), pad), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    return ids, mask


def prompts(seed: int, lengths=(7, 12, 3, 9)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 96, (n,), generator=g) for n in lengths]


DRAFTS = {"draft model": lambda draft: dict(assistant_model=draft), "prompt lookup": lambda draft: dict(
    prompt_lookup_num_tokens=3), "none": lambda draft: {},
    "draft tree": lambda draft: dict(drafter=ModelTreeDrafter(draft, budget=8, branch=2, threshold=1.0)),
    "hybrid": lambda draft: dict(drafter=HybridDrafter(ModelDrafter(draft), PromptLookupDrafter(3)))}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("drafting", list(DRAFTS))
def test_greedy_rows_equal_transformers_batched_and_their_own_batch_one(seed, drafting):
    target, draft = tiny_model(seed, arch="llama"), tiny_model(seed + 10, arch="llama")
    rows = prompts(seed)
    ids, mask = left_padded(rows)
    kwargs = DRAFTS[drafting](draft)
    out = generate(target, ids, attention_mask=mask, max_new_tokens=24, pad_token_id=0, return_dict_in_generate=True,
                   num_assistant_tokens=4, **kwargs)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    assert torch.equal(out.sequences, expected)
    for row, prompt in enumerate(rows):
        alone = generate(target, prompt[None], max_new_tokens=24, num_assistant_tokens=4, **kwargs)
        assert torch.equal(out.sequences[row, ids.shape[1]:], alone[0, len(prompt):])
    stats = out.spec_stats
    assert len(stats.rows) == 4 and stats.new_tokens == sum(r.new_tokens for r in stats.rows) == 4 * 24
    assert stats.steps == sum(r.steps for r in stats.rows)


def test_each_row_stops_at_its_own_eos_and_leaves_the_batch():
    target, draft = tiny_model(3, arch="llama"), tiny_model(13, arch="llama")
    rows = prompts(3)
    ids, mask = left_padded(rows)
    free = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    eos = int(free[1, ids.shape[1] + 2])  # the third token of row 1 ends it
    sizes = []
    out, stats = speculative_generate(target, ids, attention_mask=mask, drafter=ModelDrafter(draft, eos_token_id=[]),
                                      rule=get_rule("greedy"), k=3, max_new_tokens=12,
                                      eos_token_id=eos, pad_token_id=0,
                                      on_step=lambda e: sizes.append(e.target_cache.layers[0].keys.shape[0]))
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                               eos_token_id=eos)
    assert torch.equal(out[:, : expected.shape[1]], expected)
    ended = [r for r in range(4) if eos in out[r, ids.shape[1]:].tolist()]
    assert 1 in ended and all(stats.rows[r].new_tokens < 12 for r in ended)
    assert sizes[0] == 4 and sizes[-1] < 4  # finished rows stop costing work


def test_each_row_logs_the_substitutions_it_logs_alone():
    target = tiny_model(5, arch="llama")
    rows = [torch.cat([p, p, p]) for p in prompts(5)]  # repeats, so prompt lookup drafts
    ids, mask = left_padded(rows)
    kwargs = dict(prompt_lookup_num_tokens=4, rule=get_rule("sense", theta_e=0.0, top_k=96, window=0),
                  max_new_tokens=16, return_dict_in_generate=True)
    batch = generate(target, ids, attention_mask=mask, pad_token_id=0, **kwargs).spec_stats
    alone = [generate(target, row[None], **kwargs).spec_stats.substitutions for row in rows]
    assert [r.substitutions for r in batch.rows] == alone and any(alone)


@pytest.mark.parametrize("rule", ["greedy", "typical"])
def test_a_batch_of_trees_keeps_each_rows_accepted_branch(rule):
    """A draft that often agrees with the target (the target with a perturbed output layer), so accepted
    branches of different lengths are moved into place row by row; every row still writes what it writes
    alone, and (lossless) what transformers writes."""
    target, draft = tiny_model(0, vocab=64, init_std=0.3), tiny_model(0, vocab=64, init_std=0.3)
    with torch.no_grad():
        noise = torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
        draft.lm_head.weight += 0.1 * noise
    rows = [r % 64 for r in prompts(5)]
    ids, mask = left_padded(rows)
    trees = []
    drafter = ModelTreeDrafter(draft, budget=8, branch=2, threshold=1.0)
    out, stats = speculative_generate(target, ids, attention_mask=mask, drafter=drafter, rule=get_rule(rule), k=4,
                                      max_new_tokens=30, pad_token_id=0,
                                      on_step=lambda e: trees.append(sum(r.is_tree for r in e.draft.rows or [])))
    assert max(trees) > 1 and stats.accepted > stats.steps  # several trees in one forward; branches kept
    if rule == "greedy":  # lossless; typical is lossy, so only its rows alone say what it should write
        assert torch.equal(out, target.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False,
                                                pad_token_id=0))
    for row, prompt in enumerate(rows):
        alone, _ = speculative_generate(target, prompt[None], drafter=ModelTreeDrafter(draft, budget=8, branch=2,
                                                                                       threshold=1.0),
                                        rule=get_rule(rule), k=4, max_new_tokens=30)
        assert torch.equal(out[row, ids.shape[1]:], alone[0, len(prompt):])


@pytest.mark.parametrize("drafting", ["draft model", "prompt lookup", "draft tree", "hybrid"])
def test_sampled_rows_draw_what_they_draw_alone(drafting):
    target, draft = tiny_model(4, arch="llama"), tiny_model(14, arch="llama")
    rows = prompts(4)
    ids, mask = left_padded(rows)
    kwargs = dict(do_sample=True, temperature=0.9, top_k=20, max_new_tokens=20, num_assistant_tokens=4,
                  **DRAFTS[drafting](draft))
    out = generate(target, ids, attention_mask=mask, pad_token_id=0,
                   generator=[torch.Generator().manual_seed(50 + r) for r in range(4)], **kwargs)
    for row, prompt in enumerate(rows):
        alone = generate(target, prompt[None], generator=torch.Generator().manual_seed(50 + row), **kwargs)
        assert torch.equal(out[row, ids.shape[1]:], alone[0, len(prompt):])
    with pytest.raises(ValueError, match="one generator per row"):
        generate(target, ids, attention_mask=mask, generator=[torch.Generator()], **kwargs)


# -- the target's distribution, per row of a batch ------------------------------------------------------

V = 8
ROWS = [torch.tensor([1, 2, 3, 1, 2]), torch.tensor([4, 5])]


class AcceptEverything(SpeculativeSampling):
    """Deliberately broken: keeps every draft token (so the output follows the drafter)."""

    def __call__(self, x):
        n = torch.full((x.draft.tokens.shape[0],), x.k, dtype=torch.long)
        return Verdict(n, sample_from(x.target_probs[:, -1], x.generator), {"ratio": prefix_mask(n, x.k)})


def row_fit(target, draft, rule, copies: int = 6, calls: int = 250, tree: bool = False) -> list[float]:
    """Chi-square p-values, one per prompt of ROWS, of sampled two-token continuations decoded in
    batches of ``copies`` copies of each prompt (``tree``: each row drafting a token tree), against the
    exact distribution of that prompt."""
    sampler = Sampler(True, 1.0)
    batch = [r for r in ROWS for _ in range(copies)]
    ids, mask = left_padded(batch)
    counts = torch.zeros(len(ROWS), V * V)
    streams = [torch.Generator().manual_seed(row) for row in range(len(batch))]
    for _ in range(calls):
        drafter = ModelTreeDrafter(draft, budget=4, branch=2, threshold=1.0) if tree else ModelDrafter(draft)
        out, _ = speculative_generate(target, ids, attention_mask=mask, drafter=drafter, rule=rule,
                                      k=2, max_new_tokens=2, sampler=sampler, generator=streams)
        for row in range(len(batch)):
            counts[row // copies, out[row, -2] * V + out[row, -1]] += 1
    p_values = []
    with torch.inference_mode():
        for prompt, observed in zip(ROWS, counts):
            p1 = sampler.probs(target(prompt[None]).logits[0, -1])
            seqs = torch.cat([prompt.repeat(V, 1), torch.arange(V)[:, None]], dim=1)
            exact = (p1[:, None] * sampler.probs(target(seqs).logits[:, -1])).flatten() * observed.sum()
            big = exact >= 5
            obs = torch.cat([observed[big], observed[~big].sum()[None]]).numpy()
            exp = torch.cat([exact[big], exact[~big].sum()[None]]).numpy()
            p_values.append(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)
    return p_values


def test_every_row_of_a_sampled_batch_follows_the_target():
    target, draft = tiny_model(0, vocab=V, init_std=0.5), tiny_model(1, vocab=V, init_std=0.5)
    assert min(row_fit(target, draft, SpeculativeSampling())) > 1e-3
    assert max(row_fit(target, draft, AcceptEverything())) < 1e-6  # the negative control is caught


def test_every_row_of_a_sampled_batch_of_trees_follows_the_target():
    target, draft = tiny_model(0, vocab=V, init_std=0.5), tiny_model(1, vocab=V, init_std=0.5)
    assert min(row_fit(target, draft, SpeculativeSampling(), calls=150, tree=True)) > 1e-3


def test_row_cache_holes_and_packing_keep_what_each_row_attends_to():
    model = tiny_model(5, arch="llama")
    rows = prompts(5, lengths=(6, 9))
    ids, mask = left_padded(rows)
    cache = RowCache(model, 2)
    with torch.inference_mode():
        model(**cache.inputs(ids, mask.bool()))
        cache.extend(mask.bool())
        extra = torch.tensor([[11, 12, 13], [21, 22, 23]])
        model(**cache.inputs(extra))
        cache.extend(torch.ones(2, 3, dtype=torch.bool))
        cache.keep(torch.tensor([[True, False, False], [True, True, True]]))  # row 0 rejects 12, 13: holes
        assert cache.length == ids.shape[1] + 3 and cache.next_position.tolist() == [7, 12]
        cache.pack()
        assert cache.length == 12 and cache.valid.sum(-1).tolist() == [7, 12]
        probe = torch.tensor([[31], [32]])
        got = model(**cache.inputs(probe)).logits[:, -1]
        for row, tokens in enumerate([torch.cat([rows[0], torch.tensor([11, 31])]),
                                      torch.cat([rows[1], torch.tensor([21, 22, 23, 32])])]):
            torch.testing.assert_close(got[row], model(tokens[None]).logits[0, -1], rtol=1e-4, atol=1e-5)


def test_prompt_lookup_drafts_per_row_with_its_own_lengths():
    target = tiny_model(6, arch="llama")
    rows = [torch.tensor([5, 6, 7, 5, 6, 7, 5, 6]), torch.tensor([9, 10, 11, 12])]  # only row 0 repeats
    ids, mask = left_padded(rows)
    out = generate(target, ids, attention_mask=mask, drafter=PromptLookupDrafter(2), max_new_tokens=6,
                   pad_token_id=0, return_dict_in_generate=True)
    assert out.spec_stats.rows[0].drafted > 0
    assert torch.equal(out.sequences, target.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                                      pad_token_id=0))


def test_rows_that_stop_drafting_leave_the_draft_forwards_and_keep_their_cache(monkeypatch):
    """Short drafts stop early: the rows still drafting are fed alone (RowSubset), and every row drafts,
    before and after a ragged commit, what it drafts alone."""
    import semverify.engine.cache
    from semverify.drafters import model as model_drafter

    narrowings = []
    keep = semverify.engine.cache.RowSubset.keep
    monkeypatch.setattr(model_drafter.RowSubset, "keep", lambda self, rows: narrowings.append(rows) or keep(self, rows))
    draft_model, sampler = tiny_model(7, arch="llama"), Sampler()
    rows = prompts(7, lengths=(5, 9, 3, 7))
    # (draft lengths, tokens accepted); drafts of 12 outgrow the first probability buffer (8 columns)
    rounds = [([1, 2, 12, 12], [1, 2, 3, 12]), ([6, 6, 2, 1], [2, 6, 2, 1])]

    def drafts(group: list[int]) -> list[tuple]:
        drafter, sequences, out = ModelDrafter(draft_model), [rows[r] for r in group], []
        drafter.reset_rows(sequences)
        with torch.inference_mode():
            for ks, accepted in rounds:
                draft, hidden = drafter.draft_rows(sequences, [ks[r] for r in group], sampler, [None] * len(group),
                                                   keep_hidden=True)
                for i, r in enumerate(group):
                    n = int(draft.lengths[i])
                    out.append((draft.tokens[i, :n], draft.probs[i, :n], hidden[i, :n]))
                    sequences[i] = torch.cat([sequences[i], draft.tokens[i, : accepted[r]], torch.tensor([40 + r])])
                drafter.commit_rows([accepted[r] for r in group], torch.tensor([[40 + r] for r in group]))
        return out

    batched = drafts([0, 1, 2, 3])
    assert narrowings == [[1, 2, 3], [2, 3], [0, 1, 2], [0, 1]]  # rows still drafting went on alone
    alone = [drafts([r]) for r in range(4)]
    for position, (tokens, probs, hidden) in enumerate(batched):
        r, round_ = position % 4, position // 4
        expected = alone[r][round_]
        assert torch.equal(tokens, expected[0])
        torch.testing.assert_close(probs, expected[1], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(hidden, expected[2], rtol=1e-4, atol=1e-5)


def test_rows_that_wait_finish_their_draft_at_the_next_call_as_they_would_alone():
    """With ``rounds``, a batch's draft call stops once a row has finished and the rounds are spent; the rows
    still drafting wait and draft on at the next call: each row's finished drafts (tokens, the coupled draws at
    its own positions, probabilities, hidden states) are those it drafts alone, before and after commits."""
    from semverify.engine.coupling import CoupledNoise
    from semverify.engine.noise import at_offset

    draft_model, sampler = tiny_model(7, arch="llama"), Sampler(True, 0.8)
    rows = prompts(8, lengths=(5, 9, 3, 7))
    plans = [[(1, 1), (6, 2)], [(6, 6), (2, 0)], [(3, 1), (1, 1)], [(6, 3), (6, 6)]]  # per row: (k, accepted)

    def drafts(group: list[int]) -> tuple[list[list[tuple]], int]:
        drafter, sequences = ModelDrafter(draft_model, eos_token_id=[]), [rows[r] for r in group]
        drafter.reset_rows(sequences)
        done, waits = [[] for _ in group], 0
        with torch.inference_mode():
            while any(len(d) < len(plans[r]) for d, r in zip(done, group)):
                ks = [plans[r][len(d)][0] if len(d) < len(plans[r]) else 0 for d, r in zip(done, group)]
                noise = [at_offset(CoupledNoise(3, r), len(s) - len(rows[r])) for s, r in zip(sequences, group)]
                draft, hidden = drafter.draft_rows(sequences, ks, sampler, noise, keep_hidden=True, rounds=2)
                waiting = [False] * len(group) if draft.waiting is None else draft.waiting.tolist()
                waits += sum(waiting)
                accepted = []
                for i, r in enumerate(group):
                    if waiting[i] or not ks[i]:
                        accepted.append(None if waiting[i] else 0)
                        continue
                    n, kept = int(draft.lengths[i]), plans[r][len(done[i])][1]
                    done[i].append((draft.tokens[i, :n], draft.probs[i, :n], hidden[i, :n]))
                    sequences[i] = torch.cat([sequences[i], draft.tokens[i, :kept], torch.tensor([40 + r])])
                    accepted.append(kept)
                drafter.commit_rows(accepted, torch.tensor([[40 + r] for r in group]))
        return done, waits

    batched, waits = drafts([0, 1, 2, 3])
    assert waits > 0  # rows waited
    for r in range(4):
        alone, alone_waits = drafts([r])
        assert alone_waits == 0  # a lone row never waits
        for (tokens, probs, hidden), expected in zip(batched[r], alone[0], strict=True):
            assert torch.equal(tokens, expected[0])
            torch.testing.assert_close(probs, expected[1], rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(hidden, expected[2], rtol=1e-4, atol=1e-5)


class WaitingDrafter:
    """A scripted row drafter: row 0 waits (draft unfinished) at the first ``waits`` steps, then no row drafts."""

    gives_probs, needs_target_hidden, batching = True, False, "rows"

    def __init__(self, waits: int) -> None:
        self.waits, self.accepted = waits, []

    def reset_rows(self, prompts):
        self.batch = len(prompts)

    def propose_rows(self, sequences, ks, sampler, generators):
        from semverify.types import Draft

        draft = Draft(torch.zeros(len(sequences), 0, dtype=torch.long), lengths=torch.zeros(len(sequences),
                                                                                             dtype=torch.long))
        if self.waits:
            self.waits -= 1
            draft.waiting = torch.tensor([True] + [False] * (len(sequences) - 1))
        return draft

    def commit_rows(self, accepted, next_tokens, target_hidden):
        self.accepted.append(accepted)

    def feedback_rows(self, outcomes):
        pass

    def keep_rows(self, rows):
        pass


@pytest.mark.parametrize("waits", [1, 3])
def test_a_row_that_waits_keeps_its_unseen_tokens_and_writes_what_it_writes_alone(waits):
    """A row waiting from the first step keeps its prompt unseen by the target (its new cache columns are holes),
    while the others decode on; it then writes what the target writes alone, and counts no step while waiting."""
    target = tiny_model(0, arch="llama")
    rows = prompts(9, lengths=(6, 3, 8))
    ids = torch.stack([torch.cat([torch.zeros(8 - len(r), dtype=torch.long), r]) for r in rows])
    mask = (torch.arange(8)[None] >= torch.tensor([8 - len(r) for r in rows])[:, None]).long()
    drafter = WaitingDrafter(waits)
    out, stats = speculative_generate(target, ids, attention_mask=mask, drafter=drafter,
                                      rule=get_rule("speculative"), k=4, max_new_tokens=10, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0)
    assert torch.equal(out, expected)
    assert [a[0] for a in drafter.accepted[: waits + 1]] == [None] * waits + [0]  # the drafter heard it waited
    assert [s.steps for s in stats.rows] == [10, 10, 10] and stats.rows[0].total_time >= stats.rows[0].draft_time
