"""The one speculative loop: draft -> one target forward -> acceptance rule -> emit -> roll back.

A chain draft is a tree with a single path, so every draft is verified the same way: the target scores
all its tokens in one forward (with a tree mask only when the draft branches), the rule judges each
root-to-leaf path, and the cache keeps the accepted path and nothing after it.
"""

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
from .tree import depths, keep_path, require_full_attention, tree_attention_mask, tree_position_ids, verify_paths
from .types import Draft, StepOutcome, Verdict, VerifyInput, eos_ids


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
    eos = torch.tensor(eos_ids(eos_token_id), device=input_ids.device)
    want_hidden = rule.needs_hidden_states or drafter.needs_target_hidden
    stats, seq, started = SpecStats(), input_ids, time.perf_counter()
    with torch.inference_mode():
        cache = new_cache(target, role="target model")
        drafter.reset(input_ids)
        while stats.new_tokens < max_new_tokens:
            # 1. draft: up to k tokens, leaving room for the token the target always adds
            t0 = time.perf_counter()
            k = min(num_draft_tokens, max_new_tokens - stats.new_tokens - 1)
            draft = drafter.propose(seq, k, sampler, generator) if k > 0 else Draft.empty(1, seq.device)
            _check_draft(draft, k, rule, sampler)
            # 2. verify: one target forward over the uncached context and the draft, then the rule
            t1 = time.perf_counter()
            start = seq.shape[1]  # the draft's tokens enter the cache here
            out = target(**target_inputs(seq, draft, cache, target.dtype), cache=cache, use_cache=True,
                         output_hidden_states=want_hidden)
            hidden = out.hidden_states[-1][:, -(draft.length + 1) :] if want_hidden else None
            x = VerifyInput(draft, sampler.warp(out.logits), sampler.do_sample, hidden, generator,
                            extend=None if draft.is_tree else extender(target, cache))
            path, verdict = verify_paths(rule, x)
            t2 = time.perf_counter()
            # 3. emit the accepted path and the rule's token (up to an EOS), keep exactly that in the caches
            emitted, n, reasons, stop = emit(draft, path, verdict, eos)
            seq = torch.cat([seq, emitted], dim=1)
            commit_cache(cache, start, path[:n], seq.shape[1] - 1)
            drafter.commit(n, verdict.next_token, None if hidden is None else hidden[:, [0, *(i + 1 for i in path)]])
            # 4. account for the step and tell the drafter how it went
            outcome = StepOutcome(draft.length, n, emitted, verdict)
            stats.record_step(outcome, reasons, len(path), draft_time=t1 - t0, verify_time=t2 - t1)
            drafter.feedback(outcome)
            if streamer is not None:
                streamer.put(emitted.cpu())
            if on_step is not None:
                on_step(StepEvent(stats.steps, seq, cache, drafter, draft, verdict))
            if stop:
                break
    if streamer is not None:
        streamer.end()
    stats.total_time = time.perf_counter() - started
    return seq, stats


def target_inputs(seq: torch.LongTensor, draft: Draft, cache, dtype: torch.dtype) -> dict:
    """The verification forward's inputs: the tokens not yet cached, then the draft; a tree draft adds
    the mask and positions under which every branch is scored as if it were alone."""
    past = cache.get_seq_length()
    inputs = {"input_ids": torch.cat([seq[:, past:], draft.tokens], dim=1), "logits_to_keep": draft.length + 1}
    if draft.is_tree:
        require_full_attention(cache)
        pending = seq.shape[1] - past
        inputs["attention_mask"] = tree_attention_mask(draft.parents, past, pending, dtype, seq.device)
        inputs["position_ids"] = tree_position_ids(draft.parents, past, pending, seq.device)
    return inputs


def extender(target: PreTrainedModel, cache) -> Callable[[torch.LongTensor], torch.Tensor]:
    """``VerifyInput.extend`` for a chain draft: the target's logits over tokens placed after the draft,
    with the cache rolled back afterwards."""

    def extend(tokens: torch.LongTensor) -> torch.Tensor:
        length = cache.get_seq_length()
        out = target(input_ids=tokens, cache=cache, use_cache=True)
        keep_first(cache, length)
        return out.logits

    return extend


def emit(draft: Draft, path: list[int], verdict: Verdict, eos: torch.Tensor
         ) -> tuple[torch.LongTensor, int, dict[str, torch.Tensor], bool]:
    """The tokens a verdict adds: the accepted path, then the rule's token, cut after the first EOS
    (nothing after it is emitted, nor counted as accepted). Returns (tokens, accepted, reasons, stop)."""
    n = int(verdict.n_accepted[0])
    emitted = torch.cat([draft.tokens[:, path[:n]], verdict.next_token[:, None]], dim=1)
    stops = torch.isin(emitted[0], eos).nonzero()
    if not len(stops):
        return emitted, n, verdict.reasons, False
    end = int(stops[0]) + 1
    return emitted[:, :end], min(n, end), {name: mask[:, :end] for name, mask in verdict.reasons.items()}, True


def commit_cache(cache, start: int, accepted_nodes: list[int], length: int) -> None:
    """Move the accepted path's entries (stored at ``start`` + node) into place, then keep ``length``."""
    keep_path(cache, start, accepted_nodes)
    keep_first(cache, length)


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
