"""The one speculative loop: draft -> one target forward -> acceptance rule -> emit -> roll back.

Every row of a batch runs the same steps with its own accepted lengths: a row's rejected tokens become
masked holes in the shared KV caches (with one row, plain cropping), and finished rows leave the
batch. A chain draft is a tree with a single path, so every draft is verified the same way: the target
scores all its tokens in one forward (with a tree mask only when the draft branches), the rule judges
each root-to-leaf path, and the cache keeps the accepted path and nothing after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from transformers import PreTrainedModel, StoppingCriteriaList

from .cache import RowCache, keep_first
from .clock import device_clock
from .coupling import at_offset
from .drafters.base import Drafter, row_drafter
from .rules import BaseRule
from .sampling import Generators, Sampler
from .stats import SpecStats
from .tree import depths, keep_path
from .types import Draft, StepOutcome, Verdict, VerifyInput, eos_ids
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


class Emitted(NamedTuple):
    """What one step adds to a row: its accepted draft tokens then the rule's token, cut at a stop."""

    tokens: list[int]
    accepted: int  # draft tokens among ``tokens``
    reasons: dict[str, torch.BoolTensor]  # the row's reasons as [1, positions] masks (host)
    ended: bool  # an EOS or a stopping criterion ended the row


class Rows:
    """The rows still generating: their tokens in one device buffer (each row's prompt, then its output, from
    column 0), their lengths on the host, random streams and statistics. A step reads each row's sequence as a
    view of the buffer and writes what it emits in one copy, so no step rebuilds a sequence; rows that finish
    leave the batch and keep their output by batch index."""

    def __init__(self, prompts: list[torch.LongTensor], streams: list, device: torch.device) -> None:
        self.lengths = [len(p) for p in prompts]
        self.starts = list(self.lengths)  # where each row's output begins
        self.tokens = torch.zeros(len(prompts), max(self.lengths) + 64, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = prompt
        self.index = list(range(len(prompts)))  # each row's index in the batch
        self.all_stats = [SpecStats() for _ in prompts]
        self.streams, self.stats = list(streams), list(self.all_stats)
        self.done: dict[int, torch.LongTensor] = {}  # finished rows' outputs, by batch index

    def __len__(self) -> int:
        return len(self.lengths)

    def new(self, row: int) -> int:
        """How many tokens ``row`` has generated."""
        return self.lengths[row] - self.starts[row]

    def budgets(self, k: int, max_new_tokens: int) -> list[int]:
        """Each row's draft length: k, leaving room in its token budget for the token the target adds."""
        return [min(k, max_new_tokens - self.new(row) - 1) for row in range(len(self))]

    def sequences(self) -> list[torch.LongTensor]:
        """Each row's prompt and output so far (views of the buffer)."""
        return [self.tokens[row, :length] for row, length in enumerate(self.lengths)]

    def generators(self, sequences: list[torch.LongTensor]) -> list:
        """Each row's stream (coupled noise at the row's next output position, after its ``sequences``)."""
        return [at_offset(s, self.new(row), seq) for row, (s, seq) in enumerate(zip(self.streams, sequences))]

    def history(self, width: int) -> tuple[torch.LongTensor, torch.LongTensor] | None:
        """The last ``width`` output tokens of each row, right-aligned (-1 before a row's output), and each
        row's output length: what a rule reading the output's tail gets (None when it reads none)."""
        if not width:
            return None
        lengths = torch.tensor(self.lengths, device=self.tokens.device)
        starts = torch.tensor(self.starts, device=self.tokens.device)
        columns = lengths[:, None] - width + torch.arange(width, device=lengths.device)
        tail = self.tokens.gather(1, columns.clamp_min(0))
        return tail.masked_fill(columns < starts[:, None], -1), lengths - starts

    def emit(self, ready: list[int], paths: list[list[int]], tokens: torch.LongTensor, verdict: Verdict, eos: set,
             stopping_criteria: StoppingCriteriaList | None) -> list[Emitted]:
        """Add to each ``ready`` row its accepted path (``tokens``, ``verdict``: the ready rows' draft tokens and
        verdict, on the host) and the rule's token, cut after the first EOS or the first token after which
        ``stopping_criteria`` hold (nothing after it is emitted, nor counted as accepted)."""
        emitted = []
        for i, path in enumerate(paths):
            n = int(verdict.n_accepted[i])
            new = [*tokens[i, path[:n]].tolist(), int(verdict.next_token[i])]
            end = next((j + 1 for j, t in enumerate(new) if t in eos), None)
            judged = min(len(path), end or len(path))  # positions up to an EOS
            reasons = {name: mask[i : i + 1, :judged] for name, mask in verdict.reasons.items()}
            emitted.append(Emitted(new[:end], min(n, end or n), reasons, end is not None))
        self._write([(row, e.tokens) for row, e in zip(ready, emitted)])
        if stopping_criteria:
            emitted = [self._stop(row, e, stopping_criteria) for row, e in zip(ready, emitted)]
        return emitted

    def _write(self, pieces: list[tuple[int, list[int]]]) -> None:
        """Append each row's new tokens to the buffer in one copy (growing it by doubling when full)."""
        width = max(self.lengths[row] + len(new) for row, new in pieces)
        if width > self.tokens.shape[1]:
            grown = self.tokens.new_zeros(len(self), max(width, 2 * self.tokens.shape[1]))
            grown[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = grown
        rows = [row for row, new in pieces for _ in new]
        columns = [self.lengths[row] + j for row, new in pieces for j in range(len(new))]
        values = torch.tensor([t for _, new in pieces for t in new], dtype=torch.long)
        self.tokens[rows, columns] = values.to(self.tokens.device, non_blocking=True)
        for row, new in pieces:
            self.lengths[row] += len(new)

    def _stop(self, row: int, e: Emitted, criteria: StoppingCriteriaList) -> Emitted:
        """``e`` cut after its first token after which ``criteria`` hold (they see the row's buffer, no copy)."""
        before = self.lengths[row] - len(e.tokens)
        for j in range(1, len(e.tokens) + 1):
            if bool(criteria(self.tokens[row : row + 1, : before + j], None).any()):
                self.lengths[row] = before + j
                return Emitted(e.tokens[:j], min(e.accepted, j), {k: m[:, :j] for k, m in e.reasons.items()}, True)
        return e

    def record(self, draft: Draft, ready: list[int], paths: list[list[int]], verdict: Verdict, emitted: list[Emitted],
               draft_time: float, verify_time: float, total_time: float) -> list[StepOutcome]:
        """Count the step in the ``ready`` rows' statistics (``draft``, ``paths``, ``verdict`` and ``emitted`` are
        theirs; ``verdict`` on the host); a waiting row only spent the draft time. Returns the outcomes."""
        outcomes = []
        for i, (row, e) in enumerate(zip(ready, emitted)):
            outcomes.append(StepOutcome(_row_length(draft, i), e.accepted, torch.tensor([e.tokens]), _row(verdict, i)))
            self.stats[row].record_step(outcomes[-1], e.reasons, len(paths[i]), draft_time=draft_time,
                                        verify_time=verify_time)
        for row, stats in enumerate(self.stats):
            stats.draft_time += 0.0 if row in ready else draft_time
            stats.total_time = total_time
        return outcomes

    def keep(self, going: list[int]) -> None:
        """Only the rows at these indices generate on; the others' outputs are kept."""
        for row in set(range(len(self))) - set(going):
            self.done[self.index[row]] = self.tokens[row, self.starts[row] : self.lengths[row]].clone()
        self.tokens = self.tokens[torch.tensor(going, dtype=torch.long, device=self.tokens.device)]
        for name in ("lengths", "starts", "index", "streams", "stats"):
            setattr(self, name, [getattr(self, name)[i] for i in going])

    def padded(self, input_ids: torch.LongTensor, pad_token_id: int | None) -> torch.LongTensor:
        """``input_ids`` followed by each row's new tokens, right-padded to the longest (as transformers returns)."""
        outputs = dict(self.done)
        for row, index in enumerate(self.index):
            outputs[index] = self.tokens[row, self.starts[row] : self.lengths[row]]
        width = max(len(t) for t in outputs.values())
        out = torch.full((input_ids.shape[0], width), 0 if pad_token_id is None else pad_token_id, dtype=torch.long,
                         device=input_ids.device)
        for index, tokens in outputs.items():
            out[index, : len(tokens)] = tokens
        return torch.cat([input_ids, out], dim=1)


def to_host(tokens: torch.LongTensor, verdict: Verdict) -> tuple[torch.LongTensor, Verdict]:
    """The draft ``tokens`` and ``verdict`` on the host, in one device-to-host copy (two with scores): all the
    bookkeeping of a step reads."""
    reasons, target = list(verdict.reasons.items()), verdict.target_tokens
    parts = [verdict.n_accepted[:, None], verdict.next_token[:, None], tokens, *(m.long() for _, m in reasons),
             *([] if target is None else [target])]
    host = torch.cat(parts, dim=1).cpu().split([p.shape[1] for p in parts], dim=1)
    scores = dict(zip(verdict.scores, torch.stack(list(verdict.scores.values())).cpu())) if verdict.scores else {}
    masks = {name: mask.bool() for (name, _), mask in zip(reasons, host[3:])}
    return host[2], Verdict(host[0][:, 0], host[1][:, 0], masks, scores, host[-1] if target is not None else None)


def speculative_generate(
    target: PreTrainedModel, input_ids: torch.LongTensor, *, drafter: Drafter, rule: BaseRule, k: int,
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
            t0 = clock()  # 1. draft up to k tokens per row
            ks, sequences = rows.budgets(k, max_new_tokens), rows.sequences()
            gens = rows.generators(sequences)
            draft = (drafts.propose_rows(sequences, ks, sampler, gens) if max(ks) > 0
                     else Draft.empty(len(rows), input_ids.device))
            _check_draft(draft, ks, rule, sampler)
            # rows whose draft is unfinished (a long step draft) sit this step out
            ready = list(range(len(rows))) if draft.waiting is None else (~draft.waiting).nonzero().flatten().tolist()
            t1 = clock()  # 2. one target forward over the unseen tokens and the drafts; the rule
            start = cache.length + pending.shape[1]  # the draft's tokens enter the cache here
            x = verify_input(target, cache, pending, pending_valid, draft, sampler, sequences, gens,
                             rule.needs_hidden_states or drafter.needs_target_hidden, one_row=len(prompts) == 1,
                             ready=None if draft.waiting is None else ready, tail=rows.history(rule.history_tokens))
            paths, verdict = verify_rows(rule, x)  # over the ready rows
            t2 = clock()  # 3. emit each row's accepted path and the rule's token (one copy to the host)
            drafted, judged = to_host(x.draft.tokens, verdict)
            emitted = rows.emit(ready, paths, drafted, judged, eos, stopping_criteria)
            accepted = spread([e.accepted for e in emitted], ready, len(rows))
            commit_cache(cache, start, pending.shape[1], draft, spread(paths, ready, len(rows), []),
                         [n or 0 for n in accepted])
            next_tokens = pending[:, -1].clone()
            next_tokens[ready] = verdict.next_token
            drafts.commit_rows(accepted, next_tokens, spread(path_hidden(x.target_hidden, paths), ready, len(rows)))
            outcomes = rows.record(x.draft, ready, paths, judged, emitted, t1 - t0, t2 - t1, t2 - started)
            drafts.feedback_rows(spread(outcomes, ready, len(rows)))
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


def left_pad(tokens: list[torch.LongTensor]) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """Rows of different lengths as one left-padded [B, W] batch, and which columns are real."""
    width = max((len(t) for t in tokens), default=0)
    out = torch.zeros(len(tokens), width, dtype=torch.long, device=tokens[0].device if tokens else None)
    valid = torch.zeros(len(tokens), width, dtype=torch.bool, device=out.device)
    for row, t in enumerate(tokens):
        out[row, width - len(t) :], valid[row, width - len(t) :] = t, True
    return out, valid


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
        for row, (path, n) in enumerate(zip(paths, accepted)):
            keep_path(cache.cache, start, path[:n], row=None if len(paths) == 1 else row)
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


def _row_length(draft: Draft, row: int) -> int:
    return draft.length if draft.lengths is None else int(draft.lengths[row])


def _row(verdict: Verdict, row: int) -> Verdict:
    """One row of a batch verdict."""
    return Verdict(verdict.n_accepted[row : row + 1], verdict.next_token[row : row + 1],
                   {k: v[row : row + 1] for k, v in verdict.reasons.items()},
                   {k: v[row : row + 1] for k, v in verdict.scores.items() if not bool(v[row].isnan())},
                   None if verdict.target_tokens is None else verdict.target_tokens[row : row + 1])


def _check_call(drafter: Drafter, rule: BaseRule, k: int, max_new_tokens: int, batch: int, streamer) -> None:
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


def _check_draft(draft: Draft, ks: list[int], rule: BaseRule, sampler: Sampler) -> None:
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
