"""The one speculative loop: draft -> one target forward -> acceptance rule -> emit -> roll back.

Every row of a batch runs the same steps with its own accepted lengths: a row's rejected tokens become
masked holes in the shared KV caches (with one row, plain cropping), and finished rows leave the
batch. A chain draft is a tree with a single path, so every draft is verified the same way: the target
scores all its tokens in one forward (with a tree mask only when the draft branches), the rule judges
each root-to-leaf path, and the cache keeps the accepted path and nothing after it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import PreTrainedModel, StoppingCriteriaList

from .cache import RowCache, keep_first
from .coupling import at_offset, is_coupled
from .drafters.base import Drafter, PerRowDrafter
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
    generator: torch.Generator | list[torch.Generator] | None = None,
    streamer=None,
    on_step: Callable[[StepEvent], None] | None = None,
    attention_mask: torch.Tensor | None = None,
    pad_token_id: int | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
) -> tuple[torch.LongTensor, SpecStats]:
    """Generate up to ``max_new_tokens`` after each row of ``input_ids`` [B, T]; returns (sequences, stats).

    Rows may be left-padded (``attention_mask``, as transformers batches). Each step the drafter
    proposes at most ``num_draft_tokens`` tokens per row (never more than the row's budget left minus
    the token the target always adds), the target scores all rows in one forward pass, and ``rule``
    keeps a prefix plus one token per row. A row stops after an EOS token, as transformers does, or at
    the first token after which ``stopping_criteria`` (transformers' criteria: stop strings, time...)
    hold; the returned rows are padded on the right with ``pad_token_id``. ``generator``: one, or one per row
    (then a row draws exactly what it would draw alone). ``stats`` pools the rows; ``stats.rows`` has
    each row's own when B > 1.
    """
    prompts = prompt_rows(input_ids, attention_mask)
    _check_call(drafter, rule, num_draft_tokens, max_new_tokens, len(prompts), streamer)
    batch = len(prompts)
    streams = generator if isinstance(generator, (list, tuple)) else [generator] * batch
    eos = torch.tensor(eos_ids(eos_token_id), device=input_ids.device)
    want_hidden = rule.needs_hidden_states or drafter.needs_target_hidden
    rows = _row_drafter(drafter, batch)
    stats = [SpecStats() for _ in range(batch)]
    new: list[list[int]] = [[] for _ in range(batch)]
    active = list(range(batch))  # the batch rows still generating, by their index in input_ids
    started = time.perf_counter()
    with torch.inference_mode():
        cache = RowCache(target, batch, role="target model")
        rows.reset_rows(prompts)
        pending = input_ids  # what the target has not seen: the prompts, then each step's last token
        pending_valid = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids).bool()
        while active:
            # 1. draft: up to k tokens per row, leaving room for the token the target always adds
            t0 = time.perf_counter()
            ks = [min(num_draft_tokens, max_new_tokens - len(new[r]) - 1) for r in active]
            sequences = [torch.cat([prompts[r], torch.tensor(new[r], dtype=torch.long)]) for r in active]
            gens = [at_offset(streams[r], len(new[r])) for r in active]  # coupled noise: at this step's position
            draft = (rows.propose_rows(sequences, ks, sampler, gens) if max(ks) > 0
                     else Draft.empty(len(active), input_ids.device))
            _check_draft(draft, ks, rule, sampler, is_coupled(gens[0]))
            # 2. verify: one target forward over the unseen tokens and the drafts, then the rule per row
            t1 = time.perf_counter()
            start = cache.length + pending.shape[1]  # the draft's tokens enter the cache here
            inputs, new_valid = target_inputs(cache, pending, pending_valid, draft, target.dtype)
            out = target(**inputs, logits_to_keep=draft.length + 1, output_hidden_states=want_hidden)
            cache.extend(new_valid)
            hidden = out.hidden_states[-1][:, -(draft.length + 1) :] if want_hidden else None
            x = VerifyInput(draft, sampler.warp(out.logits, sequences, draft.tokens), sampler.do_sample, hidden,
                            gens[0] if len(gens) == 1 else gens,
                            extend=extender(target, cache) if batch == 1 and not draft.is_tree else None)
            paths, verdict = verify_rows(rule, x)
            t2 = time.perf_counter()
            # 3. emit each row's accepted path and the rule's token (up to an EOS); keep exactly that cached
            emitted = [emit(draft, i, paths[i], verdict, eos, sequences[i], stopping_criteria)
                       for i in range(len(active))]
            commit_cache(cache, start, pending.shape[1], draft, paths, [e[1] for e in emitted])
            hiddens = [None if hidden is None else hidden[i : i + 1, [0, *(j + 1 for j in paths[i])]]
                       for i in range(len(active))]
            rows.commit_rows([e[1] for e in emitted], verdict.next_token, hiddens)
            # 4. account for the step, tell the drafter how it went, let finished rows go
            outcomes = []
            for i, r in enumerate(active):
                tokens, n, reasons, _ = emitted[i]
                new[r] += tokens.tolist()
                outcomes.append(StepOutcome(_row_length(draft, i), n, tokens[None], _row(verdict, i)))
                stats[r].record_step(outcomes[-1], reasons, len(paths[i]), draft_time=t1 - t0, verify_time=t2 - t1)
                stats[r].total_time = time.perf_counter() - started
            rows.feedback_rows(outcomes)
            if streamer is not None:
                streamer.put(emitted[0][0][None].cpu())
            if on_step is not None:
                on_step(StepEvent(sum(s.steps for s in stats), _padded(input_ids, new, pad_token_id), cache.cache,
                                  drafter, draft, verdict))
            going = [i for i, r in enumerate(active) if not emitted[i][3] and len(new[r]) < max_new_tokens]
            if len(going) < len(active):
                cache.select(torch.tensor(going, dtype=torch.long))
                rows.keep_rows(going)
            sampler = sampler.rows(going)
            pending = verdict.next_token[going, None]
            pending_valid = torch.ones_like(pending, dtype=torch.bool)
            active = [active[i] for i in going]
    if streamer is not None:
        streamer.end()
    return _padded(input_ids, new, pad_token_id), SpecStats.pooled(stats, time.perf_counter() - started)


def target_inputs(cache: RowCache, pending: torch.LongTensor, pending_valid: torch.BoolTensor, draft: Draft,
                  dtype: torch.dtype) -> tuple[dict, torch.BoolTensor]:
    """The verification forward's inputs: per row the tokens the target has not seen, then its draft; a
    tree draft adds the mask and positions under which every branch is scored as if it were alone.
    Returns them and which of the new columns are real."""
    new_valid = torch.cat([pending_valid, draft_mask(draft)], dim=1)
    if not draft.is_tree:
        return cache.inputs(torch.cat([pending, draft.tokens], dim=1), new_valid), new_valid
    require_full_attention(cache.cache)
    past, device = cache.length, pending.device
    return {"input_ids": torch.cat([pending, draft.tokens], dim=1), "cache": cache.cache, "use_cache": True,
            "attention_mask": tree_attention_mask(draft.parents, past, pending.shape[1], dtype, device),
            "position_ids": tree_position_ids(draft.parents, past, pending.shape[1], device)}, new_valid


def draft_mask(draft: Draft) -> torch.BoolTensor:
    """[B, n] which draft columns hold real tokens (all, unless rows drafted different lengths)."""
    if draft.lengths is None:
        return torch.ones_like(draft.tokens, dtype=torch.bool)
    return torch.arange(draft.length, device=draft.tokens.device)[None, :] < draft.lengths[:, None]


def extender(target: PreTrainedModel, cache: RowCache) -> Callable[[torch.LongTensor], torch.Tensor]:
    """``VerifyInput.extend`` for a one-row chain draft: the target's logits over tokens placed after the
    draft, with the cache rolled back afterwards."""

    def extend(tokens: torch.LongTensor) -> torch.Tensor:
        length = cache.cache.get_seq_length()
        out = target(input_ids=tokens, cache=cache.cache, use_cache=True)
        keep_first(cache.cache, length)
        return out.logits

    return extend


def verify_rows(rule: AcceptanceRule, x: VerifyInput) -> tuple[list[list[int]], Verdict]:
    """Each row's judged path and one verdict for the batch. One row: every path of its draft (a tree's
    too, see :func:`verify_paths`). Several rows: each row's chain draft on its own, so that a row's
    verdict, and the random draws it takes from its own stream, are what they would be alone."""
    batch = x.draft.tokens.shape[0]
    if batch == 1 and x.draft.lengths is None:
        path, verdict = verify_paths(rule, x)
        return [path], verdict
    k = x.k
    lengths = x.draft.lengths.tolist() if x.draft.lengths is not None else [k] * batch
    n, token = torch.zeros(batch, dtype=torch.long), torch.zeros(batch, dtype=torch.long)
    reasons: dict[str, torch.Tensor] = {}
    scores: dict[str, torch.Tensor] = {}
    target_tokens = None
    for row, length in enumerate(lengths):
        part = rule(_row_input(x, row, length))
        n[row], token[row] = part.n_accepted[0], part.next_token[0]
        for name, mask in part.reasons.items():
            reasons.setdefault(name, torch.zeros(batch, k, dtype=torch.bool))[row, :length] = mask[0]
        for name, value in part.scores.items():
            scores.setdefault(name, torch.full((batch,), float("nan")))[row] = float(value[0])
        if part.target_tokens is not None:
            if target_tokens is None:
                target_tokens = torch.full((batch, k), -1, dtype=torch.long)
            target_tokens[row, :length] = part.target_tokens[0]
    return [list(range(length)) for length in lengths], Verdict(n, token, reasons, scores, target_tokens)


def _row_input(x: VerifyInput, row: int, length: int) -> VerifyInput:
    """The rule's input for one row of a batch, whose draft is ``length`` tokens long."""
    d, r = x.draft, slice(row, row + 1)
    draft = Draft(d.tokens[r, :length], None if d.probs is None else d.probs[r, :length])
    hidden = None if x.target_hidden is None else x.target_hidden[r, : length + 1]
    generator = x.generator[row] if isinstance(x.generator, (list, tuple)) else x.generator
    return VerifyInput(draft, x.target_logits[r, : length + 1], x.do_sample, hidden, generator)


def emit(draft: Draft, row: int, path: list[int], verdict: Verdict, eos: torch.Tensor, sequence: torch.LongTensor,
         stopping_criteria: StoppingCriteriaList | None = None) -> tuple[torch.LongTensor, int, dict, bool]:
    """The tokens a verdict adds to ``row`` (whose text so far is ``sequence``): its accepted path, then
    the rule's token, cut after the first EOS or the first token after which ``stopping_criteria`` hold
    (nothing after it is emitted, nor counted as accepted). Returns (tokens, accepted, the row's
    reasons as [1, positions] masks, whether the row ended)."""
    n = int(verdict.n_accepted[row])
    emitted = torch.cat([draft.tokens[row, path[:n]], verdict.next_token[row : row + 1]])
    reasons = {name: mask[row : row + 1, : len(path)] for name, mask in verdict.reasons.items()}
    end = next((int(i) + 1 for i in torch.isin(emitted, eos).nonzero()[:1].flatten()), None)
    if stopping_criteria:
        for j in range(1, (end or len(emitted)) + 1):
            if bool(stopping_criteria(torch.cat([sequence, emitted[:j]])[None], None).any()):
                end = j
                break
    if end is None:
        return emitted, n, reasons, False
    return emitted[:end], min(n, end), {name: mask[:, :end] for name, mask in reasons.items()}, True


def commit_cache(cache: RowCache, start: int, pending: int, draft: Draft, paths: list[list[int]],
                 accepted: list[int]) -> None:
    """Keep in each row the unseen tokens and its accepted draft tokens (a tree's accepted path is moved
    into place first); every other new column becomes a hole, or is cropped."""
    if draft.is_tree:
        keep_path(cache.cache, start, paths[0][: accepted[0]])
    kept = torch.arange(draft.length)[None, :] < torch.tensor(accepted)[:, None]
    cache.keep(torch.cat([torch.ones(len(accepted), pending, dtype=torch.bool), kept], dim=1))


def prompt_rows(input_ids: torch.LongTensor, attention_mask: torch.Tensor | None) -> list[torch.LongTensor]:
    """Each row's prompt without its left padding; right padding and all-padding rows are refused."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: the prompt needs at least one token")
    if attention_mask is None:
        return list(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids "
                         f"{tuple(input_ids.shape)}; they must match")
    mask = attention_mask.bool()
    for row, m in enumerate(mask):
        if not bool(m.any()):
            raise ValueError(f"row {row} of the batch is all padding: every prompt needs at least one token")
        if bool((m[1:] < m[:-1]).any()):
            raise ValueError(f"row {row} of the batch is padded on the right (or has a gap); semverify batches "
                             "left-padded prompts, as transformers generates: tokenizer.padding_side = 'left'")
    return [ids[m] for ids, m in zip(input_ids, mask)]


def _row_drafter(drafter: Drafter, batch: int):
    """The drafter as a batch of rows: itself when it drafts rows together (a draft model), else one
    copy per row of a single-sequence drafter (prompt lookup, retrieval), or itself for one row."""
    if batch > 1 and getattr(drafter, "batch_rows", False):
        return drafter
    if batch == 1:
        return PerRowDrafter([drafter])
    if not getattr(drafter, "per_row_copies", True):
        raise NotImplementedError(f"{type(drafter).__name__} drafts one sequence at a time; decode with batch "
                                  "size 1 (or use assistant_model= for token drafts)")
    return PerRowDrafter([copy.copy(drafter) for _ in range(batch)])


def _row_length(draft: Draft, row: int) -> int:
    return draft.length if draft.lengths is None else int(draft.lengths[row])


def _row(verdict: Verdict, row: int) -> Verdict:
    """One row of a batch verdict."""
    return Verdict(verdict.n_accepted[row : row + 1], verdict.next_token[row : row + 1],
                   {k: v[row : row + 1] for k, v in verdict.reasons.items()},
                   {k: v[row : row + 1] for k, v in verdict.scores.items() if not bool(v[row].isnan())},
                   None if verdict.target_tokens is None else verdict.target_tokens[row : row + 1])


def _padded(input_ids: torch.LongTensor, new: list[list[int]], pad_token_id: int | None) -> torch.LongTensor:
    """``input_ids`` followed by each row's new tokens, right-padded to the longest (as transformers returns)."""
    width = max(len(n) for n in new)
    out = torch.full((input_ids.shape[0], width), 0 if pad_token_id is None else pad_token_id, dtype=torch.long)
    for row, tokens in enumerate(new):
        out[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return torch.cat([input_ids, out.to(input_ids.device)], dim=1)


def _check_call(drafter, rule, num_draft_tokens, max_new_tokens, batch, streamer) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if num_draft_tokens < 1:
        raise ValueError(f"the number of draft tokens per step (k) must be >= 1, got {num_draft_tokens}")
    if rule.needs_draft_probs and not drafter.gives_probs:
        raise ValueError(
            f"acceptance rule {rule.name!r} needs draft probabilities, but {type(drafter).__name__} "
            "proposes deterministic tokens without them; use a draft model (assistant_model=...)"
        )
    if streamer is not None and batch > 1:
        raise ValueError("a streamer takes one sequence, as in transformers; decode with batch size 1 to stream")


def _check_draft(draft: Draft, ks: list[int], rule: AcceptanceRule, sampler: Sampler, coupled: bool) -> None:
    k = max(ks)
    if draft.is_tree:
        if sampler.processors is not None:
            raise NotImplementedError("logits processors (repetition_penalty, min_new_tokens, ...) are applied to "
                                      "chain drafts; use a chain drafter with them")
        if sampler.do_sample and not coupled and not hasattr(rule, "verify_tree"):
            raise NotImplementedError(f"rule {rule.name!r} judges tree drafts path by path, which is exact for "
                                      "greedy decoding only; sample over trees with rule='speculative', or use "
                                      "do_sample=False or a chain drafter")
        deepest = int(depths(draft.parents).max()) if draft.length else 0
        if deepest > k:
            raise ValueError(f"the drafter proposed a tree {deepest} tokens deep, deeper than the {k} asked for")
    elif draft.length > k or (draft.lengths is not None and bool((draft.lengths > torch.tensor(ks)).any())):
        raise ValueError(f"the drafter proposed {draft.length} tokens, more than the {k} asked for")
    if rule.needs_draft_probs and draft.length and draft.probs is None:
        raise ValueError(f"acceptance rule {rule.name!r} needs draft probabilities; this draft has none")
