"""The one speculative loop: draft -> one target forward -> acceptance rule -> emit -> roll back.

Every row of a batch runs the same steps with its own accepted lengths: a row's rejected tokens become
masked holes in the shared KV caches (with one row, plain cropping), and finished rows leave the
batch. A chain draft is a tree with a single path, so every draft is verified the same way: the target
scores all its tokens in one forward (with a tree mask only when the draft branches), the rule judges
each root-to-leaf path, and the cache keeps the accepted path and nothing after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers import PreTrainedModel, StoppingCriteriaList

from ..stats import SpecStats
from ..types import Draft, Judge, Verdict, VerifyInput, eos_ids
from .cache import RowCache, keep_first
from .clock import device_clock
from .coupling import is_coupled
from .drafting import Drafter, RowDrafter, row_drafter
from .rows import Emitted, Rows, left_pad, to_host
from .sampling import Generators, Sampler
from .tree import depths, keep_paths
from .verification import verify_rows
from .width_groups import grouped_forward, width_groups


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
    target: PreTrainedModel, input_ids: torch.LongTensor, *, drafter: Drafter, rule: Judge, k: int,
    max_new_tokens: int, sampler: Sampler = Sampler(), eos_token_id: int | list[int] | None = None,
    generator: Generators = None, streamer=None, on_step: Callable[[StepEvent], None] | None = None,
    attention_mask: torch.Tensor | None = None, pad_token_id: int | None = None,
    stopping_criteria: StoppingCriteriaList | None = None, profile: bool = False,
) -> tuple[torch.LongTensor, SpecStats]:
    """Generate up to ``max_new_tokens`` after each row of ``input_ids`` [B, T]; returns (sequences, stats).

    Rows may be left-padded (``attention_mask``, as transformers batches). Each step the drafter proposes
    at most ``k`` tokens per row (never more than the row's budget left minus the token the target always
    adds), the target scores all rows in one forward pass, and ``rule`` keeps a prefix plus one token per
    row. A row stops after an EOS token, as transformers does, or at the first token after which
    ``stopping_criteria`` hold; rows come back right-padded with ``pad_token_id``. ``generator``: one, or
    one per row (a row then draws what it would draw alone). ``stats`` pools the rows (``stats.rows``).
    ``profile``: wait for an accelerator's queued work at each of a step's three clock readings, so that the
    draft and verify times are exact (otherwise they time the launches; the total is always exact).
    """
    prompts = prompt_rows(input_ids, attention_mask)
    _check_call(drafter, rule, k, max_new_tokens, len(prompts), streamer)
    _check_coupling(rule, generator)
    rows = Rows(prompts, generator if isinstance(generator, (list, tuple)) else [generator] * len(prompts),
                input_ids.device)
    eos, clock = set(eos_ids(eos_token_id)), device_clock(input_ids.device, wait=profile)
    drafts, started = row_drafter(drafter, len(rows)), clock()
    with torch.inference_mode():
        cache = RowCache(target, len(rows), role="target model")
        drafts.reset_rows(prompts)
        pending = input_ids  # what the target has not seen: the prompts, then each step's last token
        pending_valid = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids).bool()
        while len(rows):
            t0 = clock()  # 1. draft up to k tokens per row (rows whose step draft is unfinished wait)
            draft, ready, sequences, gens = propose(drafts, rows, k, max_new_tokens, sampler, rule)
            t1 = clock()  # 2. one target forward over the unseen tokens and the drafts; the rule
            start = cache.length + pending.shape[1]  # the draft's tokens enter the cache here
            x = verify_input(target, cache, pending, pending_valid, draft, sampler, sequences, gens,
                             rule.needs_hidden_states or drafter.needs_target_hidden, one_row=len(prompts) == 1,
                             ready=None if draft.waiting is None else ready, tail=rows.history(rule.history_tokens))
            paths, verdict = verify_rows(rule, x)  # over the ready rows
            t2 = clock()  # 3. emit each row's accepted path and the rule's token (one copy to the host)
            emitted = settle(rows, drafts, cache, x, draft, paths, verdict, ready, start, pending, eos,
                             stopping_criteria, (t1 - t0, t2 - t1, t2 - started))
            if streamer is not None:
                streamer.put(torch.tensor([emitted[0].tokens]))
            if on_step is not None:
                on_step(StepEvent(sum(s.steps for s in rows.all_stats), rows.padded(input_ids, pad_token_id),
                                  cache.cache, drafter, x.draft, verdict))
            ended = spread([e.ended for e in emitted], ready, len(rows), False)
            going = [i for i in range(len(rows)) if not ended[i] and rows.new(i) < max_new_tokens]
            pending, pending_valid = next_pending(pending, pending_valid, verdict.next_token, ready, going,
                                                  draft.waiting is None)
            if len(going) < len(rows):  # 4. finished rows leave the batch
                cache.select(torch.tensor(going, dtype=torch.long, device=input_ids.device))
                drafts.keep_rows(going)
                rows.keep(going)
            sampler = sampler.rows(going)
    if streamer is not None:
        streamer.end()
    wall = device_clock(input_ids.device)() - started  # the total waits for the device's queue in any case
    return rows.padded(input_ids, pad_token_id), SpecStats.pooled(rows.all_stats, wall)


def propose(drafts: RowDrafter, rows: Rows, k: int, max_new_tokens: int, sampler: Sampler,
            rule: Judge) -> tuple[Draft, list[int], list[torch.LongTensor], list]:
    """Each row's draft (at most k tokens, within its budget), checked; which rows are ready to verify (a row
    whose long step draft is unfinished waits), and the rows' sequences and random streams."""
    ks, sequences = rows.budgets(k, max_new_tokens), rows.sequences()
    gens = rows.generators(sequences)
    own = getattr(rule, "coupling", None) == "own-draft"  # drafts apart from the target's noise (CoupledNoise.drafting)
    draft = (drafts.propose_rows(sequences, ks, sampler, [g.drafting() if own and is_coupled(g) else g for g in gens])
             if max(ks) > 0
             else Draft.empty(len(rows), rows.tokens.device))
    _check_draft(draft, ks, rule, sampler)
    ready = list(range(len(rows))) if draft.waiting is None else (~draft.waiting).nonzero().flatten().tolist()
    return draft, ready, sequences, gens


def settle(rows: Rows, drafts: RowDrafter, cache: RowCache, x: VerifyInput, draft: Draft, paths: list[list[int]],
           verdict: Verdict, ready: list[int], start: int, pending: torch.LongTensor, eos: set,
           stopping_criteria: StoppingCriteriaList | None, times: tuple[float, float, float]) -> list[Emitted]:
    """After the rule: emit each ready row's accepted path and token (one copy of the verdict to the host),
    keep them in the target's cache and the drafter, and count the step (``times``: draft, verify, total)."""
    drafted, judged = to_host(x.draft.tokens, verdict)
    emitted = rows.emit(ready, paths, drafted, judged, eos, stopping_criteria)
    accepted = spread([e.accepted for e in emitted], ready, len(rows))
    commit_cache(cache, start, pending.shape[1], draft, spread(paths, ready, len(rows), []),
                 [n or 0 for n in accepted])
    next_tokens = pending[:, -1].clone()
    next_tokens[ready] = verdict.next_token
    drafts.commit_rows(accepted, next_tokens, spread(path_hidden(x.target_hidden, paths), ready, len(rows)))
    outcomes = rows.record(x.draft, ready, paths, judged, emitted, *times)
    drafts.feedback_rows(spread(outcomes, ready, len(rows)))
    return emitted


def next_pending(pending: torch.LongTensor, valid: torch.BoolTensor, next_token: torch.LongTensor, ready: list[int],
                 going: list[int], all_ready: bool) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """What the target has not seen, for the rows ``going`` on: each ready row's new token; a row that waited for
    its draft keeps its unseen tokens."""
    if all_ready:
        return next_token[going, None], torch.ones(len(going), 1, dtype=torch.bool, device=pending.device)
    unseen = [pending[i, valid[i]] for i in range(len(pending))]
    for i, token in zip(ready, next_token):
        unseen[i] = token[None]
    return left_pad([unseen[i] for i in going])


def verify_input(target: PreTrainedModel, cache: RowCache, pending: torch.LongTensor, pending_valid: torch.BoolTensor,
                 draft: Draft, sampler: Sampler, sequences: list[torch.LongTensor], generators: list,
                 want_hidden: bool, one_row: bool, ready: list[int] | None = None,
                 tail: tuple[torch.LongTensor, torch.LongTensor] | None = None) -> VerifyInput:
    """Run the target once over each row's unseen tokens and its draft (extending ``cache``) and build what
    the rule sees: the warped logits of the draft positions and the one after, hidden states on request, and
    the rows' output ``tail`` (`Rows.history`) where the rule reads it.
    ``ready``: the only rows fed and judged (the others wait for their draft; their new columns are holes)."""
    if ready is not None and draft.branches:
        raise NotImplementedError("a tree draft cannot leave rows waiting")
    inputs, new_valid = target_inputs(cache, pending, pending_valid, draft, target.dtype)
    fed = list(range(len(new_valid))) if ready is None else ready
    if ready is not None:
        new_valid[[i for i in range(len(new_valid)) if i not in ready]] = False  # a waiting row's columns are holes
    lengths = None if draft.lengths is None or draft.branches else draft.lengths.tolist()
    split = (width_groups([lengths[i] for i in fed], pending.shape[1])  # ragged chains (an accelerator pads cheaply)
             if lengths is not None and cache.device.type == "cpu" else None)
    groups = [[fed[i] for i in group] for group in split] if split else None if ready is None else [ready]
    if groups is None:
        out = target(**inputs, logits_to_keep=draft.length + 1, output_hidden_states=want_hidden)
        cache.extend(new_valid)
        logits, hidden = out.logits, out.hidden_states[-1][:, -(draft.length + 1) :] if want_hidden else None
    else:  # ragged chains: rows of similar length verified together, none padded to the longest
        logits, hidden = grouped_forward(target, cache, torch.cat([pending, draft.tokens], dim=1), new_valid, lengths,
                                         groups, want_hidden)
    if ready is not None:
        draft, sampler, logits = draft.select(ready), sampler.rows(ready), logits[ready]
        hidden = None if hidden is None else hidden[ready]
        sequences, generators = [sequences[i] for i in ready], [generators[i] for i in ready]
        tail = None if tail is None else (tail[0][ready], tail[1][ready])
    history, output_lengths = (None, None) if tail is None else tail
    return VerifyInput(draft, sampler.warp(logits, sequences, draft.tokens), sampler.do_sample, hidden,
                       generators[0] if len(generators) == 1 else generators,
                       extend=extender(target, cache) if one_row and not draft.is_tree else None,
                       history=history, output_lengths=output_lengths)


def spread(values: list, ready: list[int], batch: int, fill=None) -> list:
    """Per-row ``values`` of the ``ready`` rows as a list over the whole batch, ``fill`` for the others."""
    out = [fill] * batch
    for i, value in zip(ready, values):
        out[i] = value
    return out


def path_hidden(hidden: torch.Tensor | None, paths: list[list[int]]) -> list[torch.Tensor | None]:
    """Each row's target hidden states at the positions it kept: the root, then its judged path."""
    return [None if hidden is None else hidden[i : i + 1, [0, *(j + 1 for j in path)]] for i, path in enumerate(paths)]


def target_inputs(cache: RowCache, pending: torch.LongTensor, pending_valid: torch.BoolTensor, draft: Draft,
                  dtype: torch.dtype) -> tuple[dict, torch.BoolTensor]:
    """The verification forward's inputs: per row the tokens the target has not seen, then its draft; a
    tree draft (in any row) adds the mask and positions under which every branch is scored as if it were alone.
    Returns them and which of the new columns are real."""
    new_valid = torch.cat([pending_valid, draft_mask(draft)], dim=1)
    parents = draft.row_parents() if draft.branches else None  # a tree: its mask (each layer's window) and positions
    return cache.inputs(torch.cat([pending, draft.tokens], dim=1), new_valid, parents=parents), new_valid


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


def commit_cache(cache: RowCache, start: int, pending: int, draft: Draft, paths: list[list[int]],
                 accepted: list[int]) -> None:
    """Keep in each row the unseen tokens and its accepted draft tokens (a tree's accepted path is moved
    into place first); every other new column becomes a hole, or is cropped."""
    if draft.branches:
        keep_paths(cache.cache, start, [path[:n] for path, n in zip(paths, accepted)])
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


def _check_call(drafter: Drafter, rule: Judge, k: int, max_new_tokens: int, batch: int, streamer) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if k < 1:
        raise ValueError(f"the number of draft tokens per step (k) must be >= 1, got {k}")
    if rule.needs_draft_probs and not drafter.gives_probs:
        raise ValueError(
            f"acceptance rule {rule.name!r} needs draft probabilities, but {type(drafter).__name__} "
            "proposes deterministic tokens without them; use a draft model (assistant_model=...)"
        )
    if rule.needs_extend and batch > 1:
        raise ValueError(f"acceptance rule {rule.name!r} asks the target about each draft with extra forwards on "
                         "one row's cache; decode with batch size 1")
    if streamer is not None and batch > 1:
        raise ValueError("a streamer takes one sequence, as in transformers; decode with batch size 1 to stream")


def _check_coupling(rule: Judge, generator: Generators) -> None:
    """Refuse coupled noise for a rule that does not say how a coupled run may draw for it."""
    streams = generator if isinstance(generator, (list, tuple)) else [generator]
    if any(map(is_coupled, streams)) and getattr(rule, "coupling", None) is None:
        raise ValueError(f"rule {rule.name!r} cannot run with coupled noise: it states no law (implement "
                         "law(x) -> TokenLaw, and the engine draws for it in every mode), and it did not say that it "
                         "decides from the target's own tokens (target_choices) with drafts drawn apart (set "
                         "_coupling = 'own-draft'); see docs/contributing.md")


def _check_draft(draft: Draft, ks: list[int], rule: Judge, sampler: Sampler) -> None:
    k = max(ks)
    if draft.branches:
        if sampler.processors is not None:
            raise NotImplementedError("logits processors (repetition_penalty, min_new_tokens, ...) are applied to "
                                      "chain drafts; use a chain drafter with them")
        deepest = [int(depths(r.parents).max()) if r.is_tree and r.length else r.length
                   for r in map(draft.row, range(len(ks)))]
        if any(d > row_k for d, row_k in zip(deepest, ks)):
            raise ValueError(f"the drafter proposed a tree {max(deepest)} tokens deep, deeper than the {k} asked for")
    elif draft.length > k or (draft.lengths is not None and bool((draft.lengths > draft.lengths.new_tensor(ks)).any())):
        raise ValueError(f"the drafter proposed {draft.length} tokens, more than the {k} asked for")
    if rule.needs_draft_probs and draft.length and draft.probs is None:
        raise ValueError(f"acceptance rule {rule.name!r} needs draft probabilities; this draft has none")
