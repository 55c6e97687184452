"""The draft model writes whole reasoning steps; after a rejected step it helps the target finish that
step token by token (ordinary speculative decoding) and then returns to whole steps."""

from __future__ import annotations

import torch

from ..drafters.model import ModelDrafter
from ..sampling import Sampler
from ..types import Draft
from .segment import StepSegmenter


class StepDrafter(ModelDrafter):
    """Alternates two kinds of drafts, marked in ``Draft.meta["kind"]``:

    - ``"step"``: one whole step (until a stop string or the cap), with the mean last-layer hidden
      state of the positions that emitted it in ``meta["pooled_hidden"]`` for the draft probe;
    - ``"tokens"``: ``token_k`` tokens, while the target writes a step itself (the first one, when
      ``target_first_step``, and every step after a rejection), until that step's break is emitted.
    """

    def __init__(self, model, segmenter: StepSegmenter, token_k: int = 5, target_first_step: bool = True,
                 confidence_threshold: float | None = None, eos_token_id: int | list[int] | None = None) -> None:
        super().__init__(model, confidence_threshold, eos_token_id)
        if token_k < 0:
            raise ValueError(f"token_k must be >= 0, got {token_k}")
        self.segmenter, self.token_k, self.target_first_step = segmenter, token_k, target_first_step
        self.mode, self.step_start, self._last_kind, self._last_len = "step", 0, "", 0

    def reset(self, input_ids: torch.LongTensor) -> None:
        super().reset(input_ids)
        self.mode = "tokens" if self.target_first_step else "step"
        self.step_start = input_ids.shape[1]

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler,
                generator: torch.Generator | None) -> Draft:
        if self.mode == "tokens" and self.segmenter.contains_break(input_ids[0, self.step_start :].tolist()):
            self.mode = "step"  # the target finished its step: draft whole steps again
        if self.mode == "tokens":
            draft = self.draft_tokens(input_ids, min(self.token_k, k), sampler, generator)
            draft.meta["kind"] = "tokens"
        else:
            cap = min(k, self.segmenter.max_step_tokens)
            draft = self.draft_tokens(input_ids, cap, sampler, generator,
                                      stop=lambda toks: self.segmenter.ends_step([int(t[0]) for t in toks]),
                                      keep_hidden=True)
            draft.meta["kind"] = "step"
            if draft.length:
                draft.meta["pooled_hidden"] = draft.meta.pop("hidden").mean(dim=1)
            self.step_start = input_ids.shape[1]
        self._last_kind, self._last_len = draft.meta.get("kind", ""), draft.length
        return draft

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden=None) -> None:
        super().commit(n_accepted, next_token, target_hidden)
        if self._last_kind == "step" and self._last_len:
            if n_accepted == self._last_len:
                self.step_start += self._last_len  # the target's bonus token opens the next step
            else:
                self.mode = "tokens"  # rejected: the target writes this step, starting at step_start
