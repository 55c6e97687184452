"""A small language model as drafter: one batched forward per draft token for every row, and its own KV
cache rolled back to each row's accepted prefix."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from transformers import PreTrainedModel

from ..engine.argmax import vocab_argmax
from ..engine.cache import RowCache, RowSubset
from ..engine.sampling import Sampler, sample_rows
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
    """The next draft token of each ``active`` row: the argmax, or a draw from ``q`` at the row's draft position
    from its own stream (the rows' coupled noise in one batched draw)."""
    if not sampler.do_sample:
        return vocab_argmax(logits[active])
    return sample_rows(q[active], [generators[row] for row in active], [lengths[row] for row in active],
                       tokens[active])


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
        self.lengths: list[int] = []  # with adaptive: each row's draft length now
        if eos_token_id is None:
            eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos = set(eos_ids(eos_token_id))
        self.rows: RowCache | None = None
        self.fed: list[int] = []  # tokens of each row's sequence (then its unverified draft) held in the cache
        self.partial: list[Unfinished | None] = []  # per row: the draft it waits to finish
        self._base: list[int] = []  # each row's sequence length at the last draft

    @property
    def cache(self):
        """The draft model's transformers cache."""
        return self.rows.cache

    def reset(self, input_ids: torch.LongTensor) -> None:
        self.reset_rows([input_ids[0]])

    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        self.rows = RowCache(self.model, len(prompts), role="draft model")
        self.fed, self.partial, self._base = [0] * len(prompts), [None] * len(prompts), [0] * len(prompts)
        self.lengths = [self.start] * len(prompts)

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
        """Up to ``ks[b]`` tokens after each row's sequence, drafted together: one forward per draft
        token for all rows still drafting. ``stop``: one test for every row, or one per row (None: none).
        ``ride_to``: a row may draft on to this length while another row still drafts within its own
        ``ks`` (the batched forwards run for it anyway). ``rounds``: once this many forwards have run and
        some row has finished, rows still drafting stop here and wait (``Draft.waiting``): they draft on
        where they stopped at the next call, with the same ``ks`` and ``stop``, and are not verified
        meanwhile. Returns the padded draft with its ``lengths`` (and hidden states)."""
        if self.adaptive:
            ks = [min(k, length) for k, length in zip(ks, self.lengths)]
        elif self.planner is not None:  # one length for the batch, planned from the pooled acceptance
            planned = self.planner.choose()
            ks = [min(k, planned) for k in ks]
        batch, device = len(sequences), self.model.device
        caps = ks if ride_to is None else [max(k, r) for k, r in zip(ks, ride_to)]
        most = max(caps)
        self._base = [len(seq) for seq in sequences]
        if max(ks) == 0:  # plain decoding this step; the cache catches up at the next draft
            return Draft.empty(batch, sequences[0].device), None
        stops = stop if isinstance(stop, list) else [stop] * batch
        tokens = torch.zeros(batch, most, dtype=torch.long, device=device)
        lengths = [0] * batch
        for row, part in enumerate(self.partial):  # rows that waited draft on from where they stopped
            if part is not None:
                lengths[row] = len(part.tokens)
                tokens[row, : len(part.tokens)] = part.tokens
        # tokens the cache has not seen, right-aligned: the last column is every row's newest token
        pending = [torch.cat([seq, tokens[row, : lengths[row]].to(seq.device)])[fed:]
                   for row, (seq, fed) in enumerate(zip(sequences, self.fed))]
        width = max(len(p) for p in pending)
        feed = torch.zeros(batch, width, dtype=torch.long, device=device)
        valid = torch.zeros(batch, width, dtype=torch.bool, device=device)
        for row, p in enumerate(pending):
            feed[row, width - len(p) :], valid[row, width - len(p) :] = p, True
        drafting = [k > n for k, n in zip(ks, lengths)]
        scratch = base = None  # with logits processors: each row's sequence, then its draft, written as drawn
        if sampler.processors is not None:
            base = torch.tensor([len(seq) for seq in sequences], device=device)
            scratch = torch.zeros(batch, int(base.max()) + most, dtype=torch.long, device=device)
            for row, seq in enumerate(sequences):
                scratch[row, : len(seq) + lengths[row]] = torch.cat([seq, tokens[row, : lengths[row]]])
        probs = hidden = None  # [B, <= most, V] and [B, <= most, H], filled per row at its own positions
        narrowed = None  # on a CPU, once a quarter of the rows fed have stopped, only rows still drafting are fed
        for j in range(most):
            if not any(drafting):
                break
            active = [row for row in range(batch) if drafting[row]]
            fed_rows = batch if narrowed is None else len(narrowed.rows)
            if j and device.type == "cpu" and 4 * len(active) <= 3 * fed_rows:
                narrowed = narrowed or RowSubset(self.rows)
                narrowed.keep(active)
            fed = self.rows if narrowed is None else narrowed
            out = self.model(**fed.inputs(feed, valid), logits_to_keep=1, output_hidden_states=keep_hidden)
            fed.extend(valid)
            self.fed = [n + v for n, v in zip(self.fed, valid.sum(-1).tolist())]
            logits = out.logits[:, -1] if narrowed is None else narrowed.spread(out.logits[:, -1])
            q = sampler.probs(logits, None if scratch is None else [  # logits processors see each row's prefix
                scratch[row, : len(seq) + lengths[row]] for row, seq in enumerate(sequences)])
            room = max(lengths[row] for row in active) + 1
            probs = widened(probs, q, room, most)
            if keep_hidden:
                last = out.hidden_states[-1][:, -1]
                last = last if narrowed is None else narrowed.spread(last)
                hidden = widened(hidden, last, room, most)
            drawn = draw(logits, q, sampler, generators, lengths, tokens, active)
            index = torch.tensor(active, device=device)
            at = torch.tensor([lengths[row] for row in active], device=device)
            tokens[index, at], probs[index, at] = drawn, q[index]
            if keep_hidden:
                hidden[index, at] = last[index]
            if scratch is not None:
                scratch[index, base[index] + at] = drawn
            ends = self._ends(drawn, q[index]).tolist()  # one read of the rows' stop tests
            for row, end in zip(active, ends):
                lengths[row] += 1
                drafting[row] = not (end or lengths[row] == caps[row] or (
                    stops[row] is not None and stops[row](tokens[row, : lengths[row]].tolist())))
            owing = [d and n < k for d, n, k in zip(drafting, lengths, ks)]  # rows short of their own draft
            if not any(owing) or (rounds is not None and j + 1 >= rounds and not all(owing)):
                break  # only rows riding along are left, or rows that owe more wait for the next call
            # only rows that draft on
            feed = tokens.gather(1, (torch.tensor(lengths, device=device)[:, None] - 1).clamp_min(0))
            valid = torch.tensor(drafting, device=device)[:, None]
        if narrowed is not None:
            narrowed.close()
        return self._finish(tokens, probs, hidden, lengths, owing, keep_hidden)

    def _ends(self, drawn: torch.LongTensor, q: torch.Tensor) -> torch.BoolTensor:
        """Which rows' drafts end at their ``drawn`` tokens (drawn from ``q`` [A, V]): an end-of-sequence token,
        a top probability below ``confidence_threshold``, an entropy above ``entropy_stop``."""
        end = torch.isin(drawn, torch.tensor(sorted(self.eos), dtype=torch.long, device=drawn.device))
        if self.confidence_threshold is not None:
            end |= q.max(dim=-1).values < self.confidence_threshold
        if self.entropy_stop is not None:
            end |= entropy(q) > self.entropy_stop
        return end

    def _finish(self, tokens: torch.LongTensor, probs: torch.Tensor, hidden: torch.Tensor | None, lengths: list[int],
                waiting: list[bool], keep_hidden: bool) -> tuple[Draft, torch.Tensor | None]:
        """The draft of the rows that finished (each row's earlier part, from its last call, put first);
        rows still waiting keep theirs in ``partial`` and show no tokens."""
        for row, part in enumerate(self.partial):
            if part is not None:
                probs[row, : len(part.tokens)] = part.probs
                if keep_hidden and part.hidden is not None:
                    hidden[row, : len(part.tokens)] = part.hidden
        self.partial = [Unfinished(tokens[row, :n].clone(), probs[row, :n].clone(),
                                   None if hidden is None else hidden[row, :n].clone())
                        if wait else None for row, (n, wait) in enumerate(zip(lengths, waiting))]
        lengths = [0 if wait else n for n, wait in zip(lengths, waiting)]
        n = max(lengths)
        draft = Draft(tokens[:, :n], probs[:, :n], lengths=torch.tensor(lengths, device=tokens.device),
                      waiting=torch.tensor(waiting, device=tokens.device) if any(waiting) else None)
        return draft, hidden[:, :n] if keep_hidden and hidden is not None else None

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden=None) -> None:
        self.commit_rows([n_accepted], next_token, [target_hidden])

    def commit_rows(self, accepted: list[int | None], next_tokens: torch.LongTensor, target_hidden=None) -> None:
        """Keep in each row's cache its sequence and its accepted draft tokens (the rest become holes); a row
        that waits (``None``) keeps everything it drafted so far."""
        self.fed = [fed if n is None else min(fed, base + n) for fed, base, n in zip(self.fed, self._base, accepted)]
        self.rows.keep_counts(self.fed)

    def feedback_rows(self, outcomes: list[StepOutcome]) -> None:
        """Adaptive lengths: +2 after a fully accepted draft, -1 otherwise (never below 1); a planner counts
        the acceptance of every draft. A row that waited (None) learns nothing."""
        if self.planner is not None:
            for o in outcomes:
                if o is not None and o.drafted:
                    self.planner.update(o.drafted, o.accepted)
        if self.adaptive:
            self.lengths = [length if o is None else length + 2 if o.drafted and o.accepted == o.drafted
                            else max(1, length - 1) for length, o in zip(self.lengths, outcomes)]

    def feedback(self, outcome: StepOutcome) -> None:
        self.feedback_rows([outcome])

    def keep_rows(self, rows: list[int]) -> None:
        self.rows.select(torch.tensor(rows, dtype=torch.long))
        for name in ("fed", "partial", "_base", "lengths"):
            setattr(self, name, [getattr(self, name)[i] for i in rows])
