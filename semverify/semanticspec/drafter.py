"""The draft model writes whole reasoning steps; after a rejected step it helps the target finish that
step token by token (ordinary speculative decoding) and then returns to whole steps."""

from __future__ import annotations

import torch

from ..drafters.model import ModelDrafter
from ..engine.noise import is_coupled
from ..engine.sampling import Sampler
from ..types import Draft
from .drafts import StepDraft, StepTokensDraft
from .segment import StepSegmenter


def draws_by_position(sampler: Sampler, generators: list) -> bool:
    """Whether a row's draws depend on the positions drawn alone (greedy, or coupled noise), so drafting
    extra tokens in one step leaves its later draws as they were."""
    return not sampler.do_sample or all(is_coupled(g) for g in generators)


class StepDrafter(ModelDrafter):
    """Alternates two kinds of drafts, per row of a batch:

    - `StepDraft`: one whole step (until a stop string or the cap), with the mean last-layer
      hidden state of the positions that emitted it (``pooled_hidden``) for the draft probe;
    - `StepTokensDraft`: ``token_k`` tokens, while the target writes a step itself (the first
      one, when ``target_first_step``, and every step after a rejection), up to that step's break,
      which the target writes itself.

    Rows draft together in one batched pass (each its own kind, cap and stop), so a row writes what it
    would write alone. Where draws depend on their positions only (greedy, coupled noise), a batch's
    token drafts ride along with its step drafts, up to the step cap: the forwards run for them anyway,
    and a row that the target writes then advances a whole step per verification rather than
    ``token_k`` tokens. ``rounds``: in a batch, a step draft still unfinished after this many draft forwards
    waits and goes on at the next step, while the rows beside it are verified (see `ModelDrafter.draft_rows`),
    so rows the target writes do not wait for the longest step of the batch (0: every draft finishes in its
    step); outputs are the same either way.
    """

    batching = "rows"

    def __init__(self, model, segmenter: StepSegmenter, token_k: int = 5, target_first_step: bool = True,
                 confidence_threshold: float | None = None, eos_token_id: int | list[int] | None = None,
                 rounds: int = 16) -> None:
        super().__init__(model, confidence_threshold, eos_token_id)
        if token_k < 0 or rounds < 0:
            raise ValueError(f"token_k and rounds must be >= 0, got {token_k} and {rounds}")
        self.segmenter, self.token_k, self.target_first_step = segmenter, token_k, target_first_step
        self.rounds = rounds or None
        self.writing: list[str] = []  # per row: who writes its current step, "draft" or "target"
        self.step_start: list[int] = []  # per row: where its current step starts in its sequence
        self._last: list[Draft] = []

    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        super().reset_rows(prompts)
        self.writing = ["target" if self.target_first_step else "draft"] * len(prompts)
        self.step_start = [len(p) for p in prompts]

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler,
                generator: torch.Generator | None) -> Draft:
        return self.propose_rows([input_ids[0]], [k], sampler, [generator]).row(0)

    def propose_rows(self, sequences: list[torch.LongTensor], ks: list[int], sampler: Sampler,
                     generators: list) -> Draft:
        for row, seq in enumerate(sequences):
            if self.writing[row] == "target" and self.segmenter.contains_break(seq[self.step_start[row] :].tolist()):
                self.writing[row] = "draft"  # the target finished its step: draft whole steps again
        steps = [w == "draft" for w in self.writing]
        caps = [min(k, self.segmenter.max_step_tokens) if step else min(self.token_k, k) for k, step in zip(ks, steps)]
        written = [seq[start:].tolist() for seq, start in zip(sequences, self.step_start)]
        stops = [self.segmenter.ends_step if step else self._completes_step(w) for step, w in zip(steps, written)]
        ride_to = None
        if any(steps) and not all(steps) and draws_by_position(sampler, generators):
            ride_to = [0 if step else min(k, self.segmenter.max_step_tokens) for k, step in zip(ks, steps)]
        draft, hidden = self.draft_rows(sequences, caps, sampler, generators, stop=stops, keep_hidden=any(steps),
                                        ride_to=ride_to, rounds=self.rounds)
        lengths = [0] * len(sequences) if draft.lengths is None else draft.lengths.tolist()
        for row, (step, n) in enumerate(zip(steps, lengths)):
            if not step and n and stops[row](draft.tokens[row, :n].tolist()):
                lengths[row] = n - 1  # the target writes the break that ends its step (see _completes_step)
        waiting = [False] * len(sequences) if draft.waiting is None else draft.waiting.tolist()
        self._last = []
        for row, (step, n) in enumerate(zip(steps, lengths)):
            tokens, probs = draft.tokens[row : row + 1, :n], None if n == 0 else draft.probs[row : row + 1, :n]
            if waiting[row]:  # its step draft goes on at the next call
                self._last.append(StepDraft(tokens, probs))
            elif step:
                pooled = hidden[row : row + 1, :n].mean(dim=1) if hidden is not None and n else None
                self._last.append(StepDraft(tokens, probs, pooled_hidden=pooled))
                self.step_start[row] = len(sequences[row])
            else:
                self._last.append(StepTokensDraft(tokens, probs))
        width = max(lengths, default=0)
        probs = None if draft.probs is None else draft.probs[:, :width]
        return Draft(draft.tokens[:, :width], probs, lengths=torch.tensor(lengths, device=draft.tokens.device),
                     rows=list(self._last), waiting=draft.waiting)

    def _completes_step(self, written: list[int]):
        """The stop of a row's token draft while the target writes its step (``written`` so far): the
        draft token that completes the step's break ends the draft and is dropped, so the target's own
        token always ends its step and the next step starts right after the break, however long the
        token drafts were (a batch lets them ride along with the step drafts of other rows)."""
        return lambda ids: self.segmenter.contains_break(written + ids)

    def commit_rows(self, accepted: list[int], next_tokens: torch.LongTensor, target_hidden=None) -> None:
        super().commit_rows(accepted, next_tokens, target_hidden)
        for row, (last, n) in enumerate(zip(self._last, accepted)):
            if n is not None and isinstance(last, StepDraft) and last.length:
                if n == last.length:
                    self.step_start[row] += last.length  # the target's bonus token opens the next step
                else:
                    self.writing[row] = "target"  # rejected: the target writes this step, from step_start

    def keep_rows(self, rows: list[int]) -> None:
        super().keep_rows(rows)
        self.writing = [self.writing[i] for i in rows]
        self.step_start = [self.step_start[i] for i in rows]
        self._last = [self._last[i] for i in rows]
