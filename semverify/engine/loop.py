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
from .drafting import Drafter, RowDrafter, row_drafter
from .noise import Noise, drafting, is_coupled, joined, per_row
from .rows import Emitted, Limits, Rows, to_host
from .sampling import Sampler
from .step import Step, Unseen
from .tree import depths, keep_paths
from .verification import verify_rows
from .width_groups import ForwardRows, grouped_forward, width_groups


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
    generator: Noise = None, streamer=None, on_step: Callable[[StepEvent], None] | None = None,
    attention_mask: torch.Tensor | None = None, pad_token_id: int | None = None,
    stopping_criteria: StoppingCriteriaList | None = None, profile: bool = False,
) -> tuple[torch.LongTensor, SpecStats]:
    """Generate up to ``max_new_tokens`` after each row of ``input_ids`` [B, T]; returns (sequences, stats).

    Rows may be left-padded (``attention_mask``, as transformers batches). Each step the drafter proposes
    at most ``k`` tokens per row (never more than the row's budget left minus the token the target always
    adds), the target scores all rows in one forward pass, and ``rule`` keeps a prefix plus one token per
    row. A row stops after an EOS token, as transformers does, or at the first token after which
    ``stopping_criteria`` hold; rows come back right-padded with ``pad_token_id``. ``generator``: the noise
    (`semverify.engine.noise`): one stream, one per row (a row then draws what it would draw alone), or coupled.
    ``stats`` pools the rows (``stats.rows``). ``profile``: wait for an accelerator's queued work at each of a
    step's three clock readings, so that the draft and verify times are exact (otherwise they time the launches;
    the total is always exact).
    """
    prompts = prompt_rows(input_ids, attention_mask)
    _check_call(drafter, rule, k, max_new_tokens, len(prompts), streamer)
    noise = per_row(generator, len(prompts))
    _check_coupling(rule, noise)
    rows = Rows(prompts, noise, input_ids.device, Limits(max_new_tokens, set(eos_ids(eos_token_id)), stopping_criteria))
    want_hidden = rule.needs_hidden_states or drafter.needs_target_hidden
    clock = device_clock(input_ids.device, wait=profile)
    drafts, started = row_drafter(drafter, len(rows)), clock()
    with torch.inference_mode():
        cache = RowCache(target, len(rows), role="target model")
        drafts.reset_rows(prompts)
        unseen = Unseen(input_ids, torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None
                        else attention_mask.bool())
        while len(rows):
            t0 = clock()  # 1. draft up to k tokens per row (rows whose step draft is unfinished wait)
            step = propose(drafts, rows, unseen, k, sampler, rule)
            t1 = clock()  # 2. one target forward over the unseen tokens and the drafts; the rule
            verify(target, cache, step, sampler, rule, want_hidden)
            t2 = clock()  # 3. emit each row's accepted path and the rule's token (one copy to the host)
            emitted = settle(rows, drafts, cache, step, (t1 - t0, t2 - t1, t2 - started))
            if streamer is not None:
                streamer.put(torch.tensor([emitted[0].tokens]))
            if on_step is not None:
                on_step(StepEvent(sum(s.steps for s in rows.all_stats), rows.padded(input_ids, pad_token_id),
                                  cache.cache, drafter, step.x.draft, step.verdict))
            going = rows.going(spread([e.ended for e in emitted], step.ready, len(rows), False))
            unseen = step.unseen_after(going)  # 4. finished rows leave the batch
            if len(going) < len(rows):
                cache.select(torch.tensor(going, dtype=torch.long, device=input_ids.device))
                drafts.keep_rows(going)
                rows.keep(going)
            sampler = sampler.rows(going)
    if streamer is not None:
        streamer.end()
    wall = device_clock(input_ids.device)() - started  # the total waits for the device's queue in any case
    return rows.padded(input_ids, pad_token_id), SpecStats.pooled(rows.all_stats, wall)


def propose(drafts: RowDrafter, rows: Rows, unseen: Unseen, k: int, sampler: Sampler, rule: Judge) -> Step:
    """The step's drafts: at most k tokens per row (within its budget), checked; a row whose long step draft is
    unfinished waits. A rule that decides from the target's own coupled tokens gets drafts drawn from noise of
    their own (`semverify.engine.noise.drafting`)."""
    ks, sequences, noise, tail = rows.begin(k, rule.history_tokens)
    own = getattr(rule, "coupling", None) == "own-draft"
    draft = (drafts.propose_rows(sequences, ks, sampler, [drafting(g) for g in noise] if own else noise)
             if max(ks) > 0 else Draft.empty(len(rows), rows.tokens.device))
    _check_draft(draft, ks, rule, sampler)
    ready = list(range(len(rows))) if draft.waiting is None else (~draft.waiting).nonzero().flatten().tolist()
    return Step(draft, ready, sequences, noise, unseen, tail)


def verify(target: PreTrainedModel, cache: RowCache, step: Step, sampler: Sampler, rule: Judge,
           want_hidden: bool) -> None:
    """Run the target once over each row's unseen tokens and its draft (extending ``cache``), and the rule over
    the ready rows: fills the step's ``start``, ``x``, ``paths`` and ``verdict``."""
    step.start = cache.length + step.unseen.tokens.shape[1]
    logits, hidden = target_forward(target, cache, step, want_hidden)  # [B, n+1, V], [B, n+1, H] or None
    draft, ready, tail = step.draft, step.ready, step.tail
    if not step.all_ready:  # only the ready rows are judged
        draft, sampler, logits = draft.select(ready), sampler.rows(ready), logits[ready]
        hidden = None if hidden is None else hidden[ready]
        tail = None if tail is None else (tail[0][ready], tail[1][ready])
    sequences, noise = [step.sequences[i] for i in ready], joined([step.noise[i] for i in ready])
    history, output_lengths = (None, None) if tail is None else tail
    step.x = VerifyInput(draft, sampler.warp(logits, sequences, draft.tokens), sampler.do_sample, hidden, noise,
                         extend=extender(target, cache) if rule.needs_extend and not draft.is_tree else None,
                         history=history, output_lengths=output_lengths)
    step.paths, step.verdict = verify_rows(rule, step.x)


def target_forward(target: PreTrainedModel, cache: RowCache, step: Step, want_hidden: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's logits [B, n+1, V] (and last hidden states [B, n+1, H] on request) at the draft's root and
    nodes, after one forward over every row's unseen tokens and draft; a waiting row's columns become holes.
    Ragged chains on a CPU go in groups of rows of similar length, none padded to the longest."""
    draft, (unseen, unseen_valid) = step.draft, step.unseen
    if not step.all_ready and draft.branches:
        raise NotImplementedError("a tree draft cannot leave rows waiting")
    tokens = torch.cat([unseen, draft.tokens], dim=1)  # [B, u+n]
    new_valid = torch.cat([unseen_valid, draft.mask()], dim=1)
    if not step.all_ready:
        new_valid[[i for i in range(len(new_valid)) if i not in step.ready]] = False  # holes
    split = None
    if draft.kind in ("chains", "rows") and not draft.branches and cache.device.type == "cpu":  # a GPU pads cheaply
        split = width_groups([draft.row_lengths()[i] for i in step.ready], unseen.shape[1])
    if split or not step.all_ready:
        groups = [[step.ready[i] for i in group] for group in split] if split else [step.ready]
        return grouped_forward(target, cache, ForwardRows(tokens, new_valid, draft.row_lengths()), groups,
                               want_hidden)
    parents = draft.row_parents() if draft.branches else None  # a tree: its mask (each layer's window), positions
    out = target(**cache.inputs(tokens, new_valid, parents=parents), logits_to_keep=draft.length + 1,
                 output_hidden_states=want_hidden)
    cache.extend(new_valid)
    return out.logits, out.hidden_states[-1][:, -(draft.length + 1) :] if want_hidden else None


def settle(rows: Rows, drafts: RowDrafter, cache: RowCache, step: Step, times: tuple[float, float, float]
           ) -> list[Emitted]:
    """After the rule: emit each ready row's accepted path and token (one copy of the verdict to the host),
    keep them in the target's cache and the drafter, and count the step (``times``: draft, verify, total)."""
    ready, batch = step.ready, len(rows)
    emitted, outcomes = rows.add(step, *to_host(step.x.draft.tokens, step.verdict), times)
    accepted = spread([e.accepted for e in emitted], ready, batch)
    commit_cache(cache, step, spread(step.paths, ready, batch, []), [n or 0 for n in accepted])
    next_tokens = step.unseen.tokens[:, -1].clone()
    next_tokens[ready] = step.verdict.next_token
    drafts.commit_rows(accepted, next_tokens, spread(path_hidden(step.x.target_hidden, step.paths), ready, batch))
    drafts.feedback_rows(spread(outcomes, ready, batch))
    return emitted


def spread(values: list, ready: list[int], batch: int, fill=None) -> list:
    """Per-row ``values`` of the ``ready`` rows as a list over the whole batch, ``fill`` for the others."""
    out = [fill] * batch
    for i, value in zip(ready, values):
        out[i] = value
    return out


def path_hidden(hidden: torch.Tensor | None, paths: list[list[int]]) -> list[torch.Tensor | None]:
    """Each ready row's target hidden states [1, 1 + len(path), H] at the root, then its judged path, from
    ``hidden`` [B, n+1, H] (None without hidden states)."""
    return [None if hidden is None else hidden[i : i + 1, [0, *(j + 1 for j in path)]] for i, path in enumerate(paths)]


def extender(target: PreTrainedModel, cache: RowCache) -> Callable[[torch.LongTensor], torch.Tensor]:
    """``VerifyInput.extend`` for a one-row chain draft: the target's raw logits [1, m, V] over tokens [1, m]
    placed after the draft, with the cache rolled back afterwards."""

    def extend(tokens: torch.LongTensor) -> torch.Tensor:
        """Raw logits [1, m, V] of ``tokens`` [1, m] after the draft; the cache keeps none of them."""
        length = cache.cache.get_seq_length()
        out = target(input_ids=tokens, cache=cache.cache, use_cache=True)
        keep_first(cache.cache, length)
        return out.logits

    return extend


def commit_cache(cache: RowCache, step: Step, paths: list[list[int]], accepted: list[int]) -> None:
    """Keep in each row the unseen tokens and its ``accepted`` [B] draft tokens along its judged path (a tree's
    accepted path is moved into place first); every other new column becomes a hole, or is cropped."""
    if step.draft.branches:
        keep_paths(cache.cache, step.start, [path[:n] for path, n in zip(paths, accepted)])
    kept = torch.arange(step.draft.length)[None, :] < torch.tensor(accepted)[:, None]  # [B, n]
    unseen = torch.ones(len(accepted), step.unseen.tokens.shape[1], dtype=torch.bool)
    cache.keep(torch.cat([unseen, kept], dim=1))


def prompt_rows(input_ids: torch.LongTensor, attention_mask: torch.Tensor | None) -> list[torch.LongTensor]:
    """Each row's prompt [T_b] of ``input_ids`` [B, T] (``attention_mask`` [B, T] or None) without its left
    padding; right padding and all-padding rows are refused."""
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


def _check_coupling(rule: Judge, noise: list[Noise]) -> None:
    """Refuse coupled noise (``noise``: each row's) for a rule that does not say how a coupled run may draw for it."""
    if any(map(is_coupled, noise)) and getattr(rule, "coupling", None) is None:
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
