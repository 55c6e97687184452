"""A small language model as drafter: one batched forward per draft token for every row, and its own KV
cache rolled back to each row's accepted prefix."""

from __future__ import annotations

from typing import Callable

import torch
from transformers import PreTrainedModel

from ..cache import RowCache, RowSubset
from ..planner import DraftPlanner
from ..rules import entropy
from ..sampling import Sampler, sample_from
from ..types import Draft, StepOutcome, eos_ids
from .base import BaseDrafter

Stop = Callable[[list[int]], bool]  # whether a row's draft tokens so far end its draft


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
        self.fed: list[int] = []  # tokens of each row's sequence held in the cache
        self._added: list[torch.BoolTensor] = []  # columns fed during the last draft, per forward

    @property
    def cache(self):
        """The draft model's transformers cache."""
        return self.rows.cache

    def reset(self, input_ids: torch.LongTensor) -> None:
        self.reset_rows([input_ids[0]])

    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        self.rows = RowCache(self.model, len(prompts), role="draft model")
        self.fed = [0] * len(prompts)
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
                   ride_to: list[int] | None = None) -> tuple[Draft, torch.Tensor | None]:
        """Up to ``ks[b]`` tokens after each row's sequence, drafted together: one forward per draft
        token for all rows still drafting. ``stop``: one test for every row, or one per row (None: none).
        ``ride_to``: a row may draft on to this length while another row still drafts within its own
        ``ks`` (the batched forwards run for it anyway). Returns the padded draft with its ``lengths``
        (and hidden states)."""
        if self.adaptive:
            ks = [min(k, length) for k, length in zip(ks, self.lengths)]
        elif self.planner is not None:  # one length for the batch, planned from the pooled acceptance
            planned = self.planner.choose()
            ks = [min(k, planned) for k in ks]
        batch = len(sequences)
        caps = ks if ride_to is None else [max(k, r) for k, r in zip(ks, ride_to)]
        most = max(caps)
        if max(ks) == 0:  # plain decoding this step; the cache catches up at the next draft
            self._added = []
            return Draft.empty(batch, sequences[0].device), None
        stops = stop if isinstance(stop, list) else [stop] * batch
        pending = [seq[fed:] for seq, fed in zip(sequences, self.fed)]  # tokens the cache has not seen
        width = max(len(p) for p in pending)
        device = self.model.device
        feed = torch.zeros(batch, width, dtype=torch.long, device=device)
        valid = torch.zeros(batch, width, dtype=torch.bool, device=device)
        for row, p in enumerate(pending):  # right-aligned: the last column is every row's newest token
            feed[row, width - len(p) :], valid[row, width - len(p) :] = p, True
        tokens = torch.zeros(batch, most, dtype=torch.long, device=device)
        probs, hidden, lengths = [], [], [0] * batch
        drafting = [k > 0 for k in ks]
        self._added = []
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
            self._added.append(valid)
            logits = out.logits[:, -1] if narrowed is None else narrowed.spread(out.logits[:, -1])
            prefixes = None if sampler.processors is None else [  # logits processors see each row's prefix
                torch.cat([seq, tokens[row, : lengths[row]]]) for row, seq in enumerate(sequences)]
            q = sampler.probs(logits, prefixes)
            probs.append(q)
            if keep_hidden:
                last = out.hidden_states[-1][:, -1]
                hidden.append(last if narrowed is None else narrowed.spread(last))
            for row in (r for r in range(batch) if drafting[r]):  # each row draws from its own stream
                token = (sample_from(q[row : row + 1], generators[row], positions=j)[0] if sampler.do_sample
                         else logits[row].argmax())
                tokens[row, j] = token
                lengths[row] += 1
                row_tokens = tokens[row, : lengths[row]].tolist()
                drafting[row] = not (lengths[row] == caps[row] or int(token) in self.eos
                                     or (stops[row] is not None and stops[row](row_tokens))
                                     or (self.confidence_threshold is not None
                                         and float(q[row].max()) < self.confidence_threshold)
                                     or (self.entropy_stop is not None and float(entropy(q[row])) > self.entropy_stop))
            if not any(d and n < k for d, n, k in zip(drafting, lengths, ks)):
                break  # only rows riding along are left
            # only rows that draft on
            feed, valid = tokens[:, j : j + 1], torch.tensor(drafting, device=device)[:, None]
        if narrowed is not None:
            narrowed.close()
        n = max(lengths)
        draft_probs = torch.stack(probs, dim=1)[:, :n] if probs else None
        return (Draft(tokens[:, :n], draft_probs, lengths=torch.tensor(lengths, device=device)),
                torch.stack(hidden, dim=1)[:, :n] if keep_hidden and hidden else None)

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden=None) -> None:
        self.commit_rows([n_accepted], next_token, [target_hidden])

    def commit_rows(self, accepted: list[int], next_tokens: torch.LongTensor, target_hidden=None) -> None:
        """Keep in each row's cache its new tokens up to its accepted draft tokens; the rest become holes.
        Column 0 of the last draft held the pending tokens, column j the draft token j-1 of rows still drafting."""
        if not self._added:
            return
        kept = [self._added[0]] + [valid & torch.tensor([[j - 1 < n] for n in accepted], device=valid.device)
                                   for j, valid in enumerate(self._added[1:], start=1)]
        kept = torch.cat(kept, dim=1)
        self.fed = [fed + int(k.sum()) for fed, k in zip(self.fed, kept)]
        self.rows.keep(kept)
        self._added = []

    def feedback_rows(self, outcomes: list[StepOutcome]) -> None:
        """Adaptive lengths: +2 after a fully accepted draft, -1 otherwise (never below 1); a planner counts
        the acceptance of every draft."""
        if self.planner is not None:
            for o in outcomes:
                if o.drafted:
                    self.planner.update(o.drafted, o.accepted)
        if self.adaptive:
            self.lengths = [length + 2 if o.drafted and o.accepted == o.drafted else max(1, length - 1)
                            for length, o in zip(self.lengths, outcomes)]

    def feedback(self, outcome: StepOutcome) -> None:
        self.feedback_rows([outcome])

    def keep_rows(self, rows: list[int]) -> None:
        self.rows.select(torch.tensor(rows, dtype=torch.long))
        self.fed = [self.fed[i] for i in rows]
        self.lengths = [self.lengths[i] for i in rows]
