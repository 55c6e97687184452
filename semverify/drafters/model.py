"""A small language model as drafter: one batched forward per draft token for every row, and its own KV
cache rolled back to each row's accepted prefix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
from transformers import PreTrainedModel

from ..engine.argmax import vocab_argmax
from ..engine.cache import RowCache, RowSubset
from ..engine.noise import sample_rows
from ..engine.sampling import Sampler
from ..engine.step import left_pad
from ..planner import DraftPlanner
from ..rules import entropy
from ..types import Draft, StepOutcome, eos_ids
from .base import BaseDrafter

Stop = Callable[[list[int]], bool]  # whether a row's draft tokens so far end its draft


class Unfinished(NamedTuple):
    """A row's draft so far, while it waits for the next call (see `ModelDrafter.draft_rows`)."""

    tokens: torch.LongTensor  # [n]
    probs: torch.Tensor  # [n, V]
    hidden: torch.Tensor | None  # [n, H]


def widened(buffer: torch.Tensor | None, row: torch.Tensor, width: int, most: int) -> torch.Tensor:
    """A zero-padded [B, >= width, D] buffer shaped like the per-row ``row`` [B, D], grown by doubling up to
    ``most`` columns: a long step draft's probabilities reach [B, 128, V], a short one's need not."""
    if buffer is not None and buffer.shape[1] >= width:
        return buffer
    grown = row.new_zeros(row.shape[0], min(most, max(width, 8, 2 * (0 if buffer is None else buffer.shape[1]))),
                          row.shape[-1])
    if buffer is not None:
        grown[:, : buffer.shape[1]] = buffer
    return grown


def draw(logits: torch.Tensor, q: torch.Tensor, sampler: Sampler, generators: list, lengths: list[int],
         tokens: torch.LongTensor, active: list[int]) -> torch.LongTensor:
    """The next draft token [A] of each ``active`` row: the argmax of ``logits`` [B, V], or a draw from ``q``
    [B, V] at the row's draft position (``tokens`` [B, most]: its draft so far) from its own stream (the rows'
    coupled noise in one batched draw)."""
    if not sampler.do_sample:
        return vocab_argmax(logits[active])
    return sample_rows(q[active], [generators[row] for row in active], [lengths[row] for row in active],
                       tokens[active])


@dataclass
class DraftRow:
    """One row's drafting state across calls: `ModelDrafter.keep_rows` keeps or drops it whole, so no field of
    a row can be left behind when the batch shrinks."""

    length: int  # with adaptive: the row's draft length now
    fed: int = 0  # tokens of the row's sequence (then its unverified draft) held in the cache
    base: int = 0  # the row's sequence length at its last draft
    partial: Unfinished | None = None  # the draft it waits to finish


@dataclass
class DraftBuffers:
    """What one `ModelDrafter.draft_rows` call writes, each row at its own draft positions."""

    tokens: torch.LongTensor  # [B, most] each row's draft tokens
    lengths: list[int]  # each row's draft tokens so far
    most: int  # the longest draft any row may reach this call
    probs: torch.Tensor | None = None  # [B, <= most, V] the draft distribution at each position
    hidden: torch.Tensor | None = None  # [B, <= most, H] with keep_hidden: the last hidden state at each position
    scratch: torch.LongTensor | None = None  # [B, longest sequence + most] with logits processors: each row's
    # sequence, then its draft, written as drawn
    base: torch.LongTensor | None = None  # [B] with scratch: each row's sequence length

    @classmethod
    def resumed(cls, sequences: list[torch.LongTensor], partial: list[Unfinished | None], most: int,
                device: torch.device, with_prefixes: bool) -> DraftBuffers:
        """Buffers holding the drafts of rows that waited (they draft on where they stopped); ``with_prefixes``:
        the scratch rows that logits processors read."""
        batch = len(sequences)
        tokens = torch.zeros(batch, most, dtype=torch.long, device=device)
        lengths = [0] * batch
        for row, part in enumerate(partial):
            if part is not None:
                lengths[row] = len(part.tokens)
                tokens[row, : len(part.tokens)] = part.tokens
        buffers = cls(tokens, lengths, most)
        if with_prefixes:
            buffers.base = torch.tensor([len(seq) for seq in sequences], device=device)
            buffers.scratch = torch.zeros(batch, int(buffers.base.max()) + most, dtype=torch.long, device=device)
            for row, seq in enumerate(sequences):
                buffers.scratch[row, : len(seq) + lengths[row]] = torch.cat([seq, tokens[row, : lengths[row]]])
        return buffers

    def prefixes(self, sequences: list[torch.LongTensor]) -> list[torch.LongTensor] | None:
        """Each row's sequence and draft so far, for the logits processors (None without them)."""
        if self.scratch is None:
            return None
        return [self.scratch[row, : len(seq) + self.lengths[row]] for row, seq in enumerate(sequences)]

    def record(self, active: list[int], drawn: torch.LongTensor, q: torch.Tensor, last: torch.Tensor | None) -> None:
        """Write the ``active`` rows' ``drawn`` tokens [A], with their distributions ``q`` [B, V] and last hidden
        states ``last`` [B, H] (with keep_hidden), at each row's next position."""
        room = max(self.lengths[row] for row in active) + 1
        self.probs = widened(self.probs, q, room, self.most)
        if last is not None:
            self.hidden = widened(self.hidden, last, room, self.most)
        index = torch.tensor(active, device=self.tokens.device)
        at = torch.tensor([self.lengths[row] for row in active], device=self.tokens.device)
        self.tokens[index, at], self.probs[index, at] = drawn, q[index]
        if last is not None:
            self.hidden[index, at] = last[index]
        if self.scratch is not None:
            self.scratch[index, self.base[index] + at] = drawn
        for row in active:
            self.lengths[row] += 1

    def newest(self, drafting: list[bool]) -> tuple[torch.LongTensor, torch.BoolTensor]:
        """The next forward's columns: each row's newest draft token [B, 1], real for the rows ``drafting``."""
        device = self.tokens.device
        feed = self.tokens.gather(1, (torch.tensor(self.lengths, device=device)[:, None] - 1).clamp_min(0))
        return feed, torch.tensor(drafting, device=device)[:, None]


class ModelDrafter(BaseDrafter):
    """Drafts up to k tokens per row autoregressively with ``model``, sampling through the loop's sampler.

    ``confidence_threshold`` stops a row's draft early once the draft's top probability falls below it
    (transformers' ``assistant_confidence_threshold`` idea): unlikely tokens waste draft forwards;
    ``entropy_stop`` does the same once the draft's entropy (nats) exceeds it. ``adaptive`` learns each
    row's draft length from the feedback hook, as transformers' "heuristic" schedule: from ``start``,
    two more after a step that accepted every draft token, one fewer otherwise (at most the loop's k);
    ``planner`` (a `DraftPlanner`) instead picks each step's length, 0 included, for the most expected
    tokens per second from this machine's forward costs and the acceptance so far.
    A draft also ends at an end-of-sequence token (``eos_token_id``, by default the draft model's
    generation config): nothing after it would ever be emitted. Rows of a batch draft together, each
    with its own length and random stream, so every row drafts what it would draft alone.
    """

    gives_probs = True
    needs_target_hidden = False
    batching = "rows"  # one model cache serves every row, drafted in lockstep (see propose_rows)

    def __init__(self, model: PreTrainedModel, confidence_threshold: float | None = None,
                 eos_token_id: int | list[int] | None = None, entropy_stop: float | None = None,
                 adaptive: bool = False, start: int = 5, planner: DraftPlanner | None = None) -> None:
        if confidence_threshold is not None and not 0.0 <= confidence_threshold < 1.0:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        if entropy_stop is not None and entropy_stop < 0 or start < 1:
            raise ValueError("entropy_stop must be >= 0 (nats) and start >= 1")
        self.model = model
        self.confidence_threshold, self.entropy_stop = confidence_threshold, entropy_stop
        if adaptive and planner is not None:
            raise ValueError("use adaptive or a planner, not both")
        self.adaptive, self.start, self.planner = adaptive, start, planner
        if eos_token_id is None:
            eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos = set(eos_ids(eos_token_id))
        self.rows: RowCache | None = None
        self.states: list[DraftRow] = []  # per row: its draft length, cache fill and unfinished draft

    @property
    def cache(self):
        """The draft model's transformers cache."""
        return self.rows.cache

    @property
    def lengths(self) -> list[int]:
        """With adaptive: each row's draft length now."""
        return [state.length for state in self.states]

    def reset(self, input_ids: torch.LongTensor) -> None:
        self.reset_rows([input_ids[0]])

    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        self.rows = RowCache(self.model, len(prompts), role="draft model")
        self.states = [DraftRow(self.start) for _ in prompts]

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler,
                generator: torch.Generator | None) -> Draft:
        draft = self.draft_rows([input_ids[0]], [k], sampler, [generator])[0]
        n = draft.length if draft.lengths is None else int(draft.lengths[0])
        return Draft(draft.tokens[:, :n], draft.probs[:, :n]) if n else Draft.empty(1, input_ids.device)

    def propose_rows(self, sequences: list[torch.LongTensor], ks: list[int], sampler: Sampler,
                     generators: list) -> Draft:
        """Up to ``ks[b]`` tokens after each row's sequence, padded to one width, with their ``lengths``."""
        return self.draft_rows(sequences, ks, sampler, generators)[0]

    def draft_rows(self, sequences: list[torch.LongTensor], ks: list[int], sampler: Sampler, generators: list,
                   stop: Stop | list[Stop | None] | None = None, keep_hidden: bool = False,
                   ride_to: list[int] | None = None, rounds: int | None = None) -> tuple[Draft, torch.Tensor | None]:
        """Up to ``ks[b]`` tokens after each row's sequence [n_b], drafted together: one forward per draft
        token for all rows still drafting. ``stop``: one test for every row, or one per row (None: none).
        ``ride_to``: a row may draft on to this length while another row still drafts within its own
        ``ks`` (the batched forwards run for it anyway). ``rounds``: once this many forwards have run and
        some row has finished, rows still drafting stop here and wait (``Draft.waiting``): they draft on
        where they stopped at the next call, with the same ``ks`` and ``stop``, and are not verified
        meanwhile. Returns the padded draft [B, n] with its ``lengths`` (and hidden states [B, n, H])."""
        ks = self._planned(ks)
        caps = ks if ride_to is None else [max(k, r) for k, r in zip(ks, ride_to)]
        for state, seq in zip(self.states, sequences):
            state.base = len(seq)
        if max(ks) == 0:  # plain decoding this step; the cache catches up at the next draft
            return Draft.empty(len(sequences), sequences[0].device), None
        stops = stop if isinstance(stop, list) else [stop] * len(sequences)
        buffers = DraftBuffers.resumed(sequences, [state.partial for state in self.states], max(caps),
                                       self.model.device, sampler.processors is not None)
        feed, valid = self._unseen(sequences, buffers)
        drafting = [k > n for k, n in zip(ks, buffers.lengths)]
        narrowed, on_cpu = None, self.model.device.type == "cpu"  # on a CPU, only rows still drafting may be fed
        for j in range(buffers.most):
            if not any(drafting):
                break
            active = [row for row in range(len(sequences)) if drafting[row]]
            if j and on_cpu:
                narrowed = self._narrowed(narrowed, active)
            logits, last = self._forward(self.rows if narrowed is None else narrowed, feed, valid, keep_hidden)
            q = sampler.probs(logits, buffers.prefixes(sequences))  # logits processors see each row's prefix
            drawn = draw(logits, q, sampler, generators, buffers.lengths, buffers.tokens, active)
            buffers.record(active, drawn, q, last)
            ends = self._ends(drawn, q[active]).tolist()  # one read of the rows' stop tests
            for row, end in zip(active, ends):
                drafting[row] = not (end or buffers.lengths[row] == caps[row] or (
                    stops[row] is not None and stops[row](buffers.tokens[row, : buffers.lengths[row]].tolist())))
            owing = [d and n < k for d, n, k in zip(drafting, buffers.lengths, ks)]  # rows short of their own draft
            if not any(owing) or (rounds is not None and j + 1 >= rounds and not all(owing)):
                break  # only rows riding along are left, or rows that owe more wait for the next call
            feed, valid = buffers.newest(drafting)  # only rows that draft on
        if narrowed is not None:
            narrowed.close()
        return self._finish(buffers, owing, keep_hidden)

    def _planned(self, ks: list[int]) -> list[int]:
        """Each row's draft length this call: ``ks``, cut to the row's adaptive length or to the planner's
        choice (one length for the batch, planned from the pooled acceptance)."""
        if self.adaptive:
            return [min(k, state.length) for k, state in zip(ks, self.states)]
        if self.planner is not None:
            planned = self.planner.choose()
            return [min(k, planned) for k in ks]
        return ks

    def _unseen(self, sequences: list[torch.LongTensor],
                buffers: DraftBuffers) -> tuple[torch.LongTensor, torch.BoolTensor]:
        """The first forward's columns [B, W] and which are real: each row's tokens the cache has not seen
        (its sequence, then any draft it resumes), right-aligned so the last column is every row's newest token."""
        device = buffers.tokens.device
        return left_pad([torch.cat([seq.to(device), buffers.tokens[row, : buffers.lengths[row]]])[state.fed:]
                         for row, (seq, state) in enumerate(zip(sequences, self.states))])

    def _narrowed(self, narrowed: RowSubset | None, active: list[int]) -> RowSubset | None:
        """``narrowed`` (or a new `RowSubset`) feeding only the ``active`` rows once a quarter of the rows fed
        have stopped: a batched CPU forward costs about its number of rows."""
        fed_rows = len(self.states) if narrowed is None else len(narrowed.rows)
        if 4 * len(active) > 3 * fed_rows:
            return narrowed
        narrowed = narrowed or RowSubset(self.rows)
        narrowed.keep(active)
        return narrowed

    def _forward(self, fed: RowCache | RowSubset, feed: torch.LongTensor, valid: torch.BoolTensor,
                 keep_hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft forward of the columns ``feed`` [B, W] (``valid``: which are real) for the rows ``fed``
        holds, recorded in the cache: each row's next-token logits [B, V] and, with ``keep_hidden``, last hidden
        state [B, H], as a full batch."""
        out = self.model(**fed.inputs(feed, valid), logits_to_keep=1, output_hidden_states=keep_hidden)
        fed.extend(valid)
        for state, n in zip(self.states, valid.sum(-1).tolist()):
            state.fed += n
        logits = out.logits[:, -1]
        last = out.hidden_states[-1][:, -1] if keep_hidden else None
        if isinstance(fed, RowSubset):
            logits, last = fed.spread(logits), None if last is None else fed.spread(last)
        return logits, last

    def _ends(self, drawn: torch.LongTensor, q: torch.Tensor) -> torch.BoolTensor:
        """Which rows' drafts end at their ``drawn`` tokens [A] (drawn from ``q`` [A, V]): an end-of-sequence
        token, a top probability below ``confidence_threshold``, an entropy above ``entropy_stop``."""
        end = torch.isin(drawn, torch.tensor(sorted(self.eos), dtype=torch.long, device=drawn.device))
        if self.confidence_threshold is not None:
            end |= q.max(dim=-1).values < self.confidence_threshold
        if self.entropy_stop is not None:
            end |= entropy(q) > self.entropy_stop
        return end

    def _finish(self, buffers: DraftBuffers, waiting: list[bool],
                keep_hidden: bool) -> tuple[Draft, torch.Tensor | None]:
        """The draft of the rows that finished (each row's earlier part, from its last call, put first);
        rows still waiting keep theirs in their state's ``partial`` and show no tokens."""
        tokens, probs, hidden = buffers.tokens, buffers.probs, buffers.hidden
        for row, state in enumerate(self.states):
            if state.partial is not None:
                probs[row, : len(state.partial.tokens)] = state.partial.probs
                if keep_hidden and state.partial.hidden is not None:
                    hidden[row, : len(state.partial.tokens)] = state.partial.hidden
        for row, (state, n, wait) in enumerate(zip(self.states, buffers.lengths, waiting)):
            state.partial = Unfinished(tokens[row, :n].clone(), probs[row, :n].clone(),
                                       None if hidden is None else hidden[row, :n].clone()) if wait else None
        lengths = [0 if wait else n for n, wait in zip(buffers.lengths, waiting)]
        n = max(lengths)
        draft = Draft(tokens[:, :n], probs[:, :n], lengths=torch.tensor(lengths, device=tokens.device),
                      waiting=torch.tensor(waiting, device=tokens.device) if any(waiting) else None)
        return draft, hidden[:, :n] if keep_hidden and hidden is not None else None

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden=None) -> None:
        self.commit_rows([n_accepted], next_token, [target_hidden])

    def commit_rows(self, accepted: list[int | None], next_tokens: torch.LongTensor, target_hidden=None) -> None:
        """Keep in each row's cache its sequence and its accepted draft tokens (the rest become holes); a row
        that waits (``None``) keeps everything it drafted so far."""
        for state, n in zip(self.states, accepted):
            if n is not None:
                state.fed = min(state.fed, state.base + n)
        self.rows.keep_counts([state.fed for state in self.states])

    def feedback_rows(self, outcomes: list[StepOutcome]) -> None:
        """Adaptive lengths: +2 after a fully accepted draft, -1 otherwise (never below 1); a planner counts
        the acceptance of every draft. A row that waited (None) learns nothing."""
        if self.planner is not None:
            for o in outcomes:
                if o is not None and o.drafted:
                    self.planner.update(o.drafted, o.accepted)
        if self.adaptive:
            for state, o in zip(self.states, outcomes):
                if o is not None:
                    full = o.drafted and o.accepted == o.drafted
                    state.length = state.length + 2 if full else max(1, state.length - 1)

    def feedback(self, outcome: StepOutcome) -> None:
        self.feedback_rows([outcome])

    def keep_rows(self, rows: list[int]) -> None:
        self.rows.select(torch.tensor(rows, dtype=torch.long))
        self.states = [self.states[i] for i in rows]
