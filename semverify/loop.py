"""The one speculative loop: draft -> one target forward -> acceptance rule -> emit -> roll back."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import PreTrainedModel

from .cache import keep_first, new_cache
from .drafters.base import Drafter
from .rules import AcceptanceRule
from .sampling import Sampler
from .stats import SpecStats
from .tree import depths, keep_path, require_full_attention, tree_attention_mask, tree_position_ids, verify_tree
from .types import Draft, Verdict, VerifyInput, eos_ids


@dataclass
class StepEvent:
    """Loop state after one step, handed to ``on_step`` (tests use it to check cache rollback)."""

    step: int
    sequences: torch.LongTensor
    target_cache: object
    drafter: Drafter
    draft: Draft
    verdict: Verdict


def speculative_generate(
    target: PreTrainedModel,
    input_ids: torch.LongTensor,
    *,
    drafter: Drafter,
    rule: AcceptanceRule,
    num_draft_tokens: int,
    max_new_tokens: int,
    sampler: Sampler = Sampler(),
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    streamer=None,
    on_step: Callable[[StepEvent], None] | None = None,
) -> tuple[torch.LongTensor, SpecStats]:
    """Generate up to ``max_new_tokens`` after ``input_ids`` [1, T]; returns (sequences, stats).

    Each step the drafter proposes at most ``num_draft_tokens`` tokens (never more than the budget
    left minus the token the target always adds), the target scores them in one forward pass, and
    ``rule`` keeps a prefix plus one token. Generation stops after an EOS token, as transformers does.
    """
    _check_call(input_ids, drafter, rule, num_draft_tokens, max_new_tokens)
    eos = torch.tensor(eos_ids(eos_token_id))
    need_hidden = rule.needs_hidden_states or drafter.needs_target_hidden
    stats = SpecStats()
    seq = input_ids
    started = time.perf_counter()
    with torch.inference_mode():
        cache = new_cache(target, role="target model")
        drafter.reset(input_ids)
        while stats.new_tokens < max_new_tokens:
            t0 = time.perf_counter()
            k = min(num_draft_tokens, max_new_tokens - stats.new_tokens - 1)
            draft = drafter.propose(seq, k, sampler, generator) if k > 0 else Draft.empty(1, seq.device)
            _check_draft(draft, k, rule, sampler)
            t1 = time.perf_counter()
            n_draft, past, pending = draft.length, cache.get_seq_length(), seq.shape[1] - cache.get_seq_length()
            tree = {}
            if draft.is_tree:
                require_full_attention(cache)
                tree = dict(attention_mask=tree_attention_mask(draft.parents, past, pending, target.dtype, seq.device),
                            position_ids=tree_position_ids(draft.parents, past, pending, seq.device))
            out = target(
                input_ids=torch.cat([seq[:, past:], draft.tokens], dim=1),
                cache=cache,
                use_cache=True,
                logits_to_keep=n_draft + 1,
                output_hidden_states=need_hidden,
                **tree,
            )
            hidden = out.hidden_states[-1][:, -(n_draft + 1) :] if need_hidden else None
            x = VerifyInput(draft, sampler.warp(out.logits), sampler.do_sample, hidden, generator)
            if draft.is_tree:
                path, verdict = verify_tree(rule, x)
                n = int(verdict.n_accepted[0])
                keep_path(cache, past + pending, path[:n])
                accepted = draft.tokens[:, path[:n]]
                hidden = None if hidden is None else hidden[:, [0] + [i + 1 for i in path]]
            else:
                path, verdict = None, rule(x)
                n = int(verdict.n_accepted[0])
                accepted = draft.tokens[:, :n]
            t2 = time.perf_counter()
            emitted = torch.cat([accepted, verdict.next_token[:, None]], dim=1)
            stops = torch.isin(emitted[0], eos).nonzero()
            reasons = verdict.reasons
            if len(stops):  # nothing after an EOS is emitted, so it does not count as accepted either
                end = int(stops[0]) + 1
                emitted, n = emitted[:, :end], min(n, end)
                reasons = {name: mask[:, :end] for name, mask in reasons.items()}
            seq = torch.cat([seq, emitted], dim=1)
            keep_first(cache, seq.shape[1] - 1)
            drafter.commit(n, verdict.next_token, hidden)
            stats.record_step(n_draft, n, emitted.shape[1], reasons,
                              positions=len(path) if path is not None else None, scores=verdict.scores)
            stats.draft_time += t1 - t0
            stats.verify_time += t2 - t1
            if streamer is not None:
                streamer.put(emitted.cpu())
            if on_step is not None:
                on_step(StepEvent(stats.steps, seq, cache, drafter, draft, verdict))
            if len(stops):
                break
    if streamer is not None:
        streamer.end()
    stats.total_time = time.perf_counter() - started
    return seq, stats


def _check_call(input_ids, drafter, rule, num_draft_tokens, max_new_tokens) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise NotImplementedError(
            f"semverify decodes batch size 1 for now; input_ids has batch size {input_ids.shape[0]}. "
            "Loop over the prompts instead."
        )
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if num_draft_tokens < 1:
        raise ValueError(f"the number of draft tokens per step (k) must be >= 1, got {num_draft_tokens}")
    if rule.needs_draft_probs and not drafter.gives_probs:
        raise ValueError(
            f"acceptance rule {rule.name!r} needs draft probabilities, but {type(drafter).__name__} "
            "proposes deterministic tokens without them; use a draft model (assistant_model=...)"
        )


def _check_draft(draft: Draft, k: int, rule: AcceptanceRule, sampler: Sampler) -> None:
    if draft.is_tree:
        if sampler.do_sample:
            raise NotImplementedError("tree drafts are verified path by path, which is exact for greedy "
                                      "decoding only; use do_sample=False or a chain drafter")
        deepest = int(depths(draft.parents).max()) if draft.length else 0
        if deepest > k:
            raise ValueError(f"the drafter proposed a tree {deepest} tokens deep, deeper than the {k} asked for")
    elif draft.length > k:
        raise ValueError(f"the drafter proposed {draft.length} tokens, more than the {k} asked for")
    if rule.needs_draft_probs and draft.length and draft.probs is None:
        raise ValueError(f"acceptance rule {rule.name!r} needs draft probabilities; this draft has none")
