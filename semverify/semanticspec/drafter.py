"""The draft model writes whole reasoning steps; after a rejected step it helps the target finish that
step token by token (ordinary speculative decoding) and then returns to whole steps."""

from __future__ import annotations

import torch

from ..drafters.model import ModelDrafter
from ..sampling import Sampler
from ..types import Draft
from .drafts import StepDraft, StepTokensDraft
from .segment import StepSegmenter


class StepDrafter(ModelDrafter):
    """Alternates two kinds of drafts:

    - `StepDraft`: one whole step (until a stop string or the cap), with the mean last-layer
      hidden state of the positions that emitted it (``pooled_hidden``) for the draft probe;
    - `StepTokensDraft`: ``token_k`` tokens, while the target writes a step itself (the first
      one, when ``target_first_step``, and every step after a rejection), until that step's break is
      emitted.
    """

    batching = "single"  # whole steps are drafted for one sequence at a time

    def __init__(self, model, segmenter: StepSegmenter, token_k: int = 5, target_first_step: bool = True,
                 confidence_threshold: float | None = None, eos_token_id: int | list[int] | None = None) -> None:
        super().__init__(model, confidence_threshold, eos_token_id)
        if token_k < 0:
            raise ValueError(f"token_k must be >= 0, got {token_k}")
        self.segmenter, self.token_k, self.target_first_step = segmenter, token_k, target_first_step
        self.writing, self.step_start, self._last = "draft", 0, None

    def reset(self, input_ids: torch.LongTensor) -> None:
        super().reset(input_ids)
        self.writing = "target" if self.target_first_step else "draft"  # who writes the current step
        self.step_start = input_ids.shape[1]

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler,
                generator: torch.Generator | None) -> Draft:
        if self.writing == "target" and self.segmenter.contains_break(input_ids[0, self.step_start :].tolist()):
            self.writing = "draft"  # the target finished its step: draft whole steps again
        if self.writing == "target":
            tokens = self.draft_tokens(input_ids, min(self.token_k, k), sampler, generator)[0]
            draft: Draft = StepTokensDraft(tokens.tokens, tokens.probs)
        else:
            cap = min(k, self.segmenter.max_step_tokens)
            tokens, hidden = self.draft_tokens(input_ids, cap, sampler, generator, stop=self.segmenter.ends_step,
                                               keep_hidden=True)
            pooled = hidden.mean(dim=1) if hidden is not None else None
            draft = StepDraft(tokens.tokens, tokens.probs, pooled_hidden=pooled)
            self.step_start = input_ids.shape[1]
        self._last = draft
        return draft

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden=None) -> None:
        super().commit(n_accepted, next_token, target_hidden)
        if isinstance(self._last, StepDraft) and self._last.length:
            if n_accepted == self._last.length:
                self.step_start += self._last.length  # the target's bonus token opens the next step
            else:
                self.writing = "target"  # rejected: the target writes this step, starting at step_start
