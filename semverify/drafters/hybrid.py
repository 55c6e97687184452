"""Prompt lookup first, the draft model on a miss: lookup costs nothing when the text repeats itself
(lists, equations carried from line to line), and the draft model covers the rest."""

from __future__ import annotations

import copy

import torch

from ..engine.sampling import Sampler
from ..types import Draft, StepOutcome
from .base import BaseDrafter
from .model import ModelDrafter
from .prompt_lookup import PromptLookupDrafter


class HybridDrafter(BaseDrafter):
    """Proposes prompt lookup's draft when it finds at least ``min_tokens``, else the draft model's. The
    draft model's cache catches up on what lookup drafts it did not see at its next draft. A lookup
    draft has no q (one-hot, as lossless rules treat deterministic drafts), so rules that need the
    draft's distribution (easd) cannot take this drafter."""

    gives_probs = False
    batching = "copies"  # one copy per row of a batch, each with its own draft model cache (see __copy__)

    def __init__(self, model_drafter: ModelDrafter, lookup: PromptLookupDrafter | None = None,
                 min_tokens: int = 2) -> None:
        if min_tokens < 1:
            raise ValueError(f"min_tokens must be >= 1, got {min_tokens}")
        self.model_drafter, self.lookup, self.min_tokens = model_drafter, lookup or PromptLookupDrafter(), min_tokens
        self.looked_up = 0  # steps drafted by lookup since reset (how often lookup served)

    def __copy__(self) -> "HybridDrafter":
        """A copy for another row of a batch: its own model drafter and lookup state, the same models."""
        return HybridDrafter(copy.copy(self.model_drafter), copy.copy(self.lookup), self.min_tokens)

    def reset(self, input_ids: torch.LongTensor) -> None:
        self.model_drafter.reset(input_ids)
        self.lookup.reset(input_ids)
        self.looked_up = 0

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler,
                generator: torch.Generator | None) -> Draft:
        draft = self.lookup.propose(input_ids, k, sampler, generator)
        if draft.length >= self.min_tokens:
            self.looked_up += 1
            return draft
        return self.model_drafter.propose(input_ids, k, sampler, generator)

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden=None) -> None:
        self.model_drafter.commit(n_accepted, next_token, target_hidden)  # a no-op after a lookup draft

    def feedback(self, outcome: StepOutcome) -> None:
        self.model_drafter.feedback(outcome)
