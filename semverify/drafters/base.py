"""The drafter protocol the loop drives, a base class with its no-op hooks, and the empty drafter."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..sampling import Sampler
from ..types import Draft, StepOutcome


@runtime_checkable
class Drafter(Protocol):
    """Proposes up to k tokens after a sequence and keeps its own state in step with the loop.

    ``gives_probs``: whether drafts carry the q they were sampled from. ``needs_target_hidden``:
    whether ``commit`` wants the target's last-layer hidden states of the verified positions.
    """

    gives_probs: bool
    needs_target_hidden: bool

    def reset(self, input_ids: torch.LongTensor) -> None:
        """Start a new generation from the prompt ``input_ids`` [1, T]."""

    def propose(
        self, input_ids: torch.LongTensor, k: int, sampler: Sampler, generator: torch.Generator | None
    ) -> Draft:
        """Up to k tokens to follow ``input_ids`` (everything emitted so far)."""

    def commit(
        self, n_accepted: int, next_token: torch.LongTensor, target_hidden: torch.Tensor | None = None
    ) -> None:
        """The loop kept the first ``n_accepted`` tokens of the last draft, then ``next_token``."""

    def feedback(self, outcome: StepOutcome) -> None:
        """How the last step went, after ``commit``: where adaptive draft lengths learn."""


class BaseDrafter:
    """No-op ``reset``, ``commit`` and ``feedback``: a drafter overrides what it needs."""

    gives_probs = False
    needs_target_hidden = False

    def reset(self, input_ids: torch.LongTensor) -> None:
        pass

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden: torch.Tensor | None = None) -> None:
        pass

    def feedback(self, outcome: StepOutcome) -> None:
        pass


class NoDrafter(BaseDrafter):
    """Proposes nothing: the loop then decodes one target token per forward (the vanilla baseline)."""

    gives_probs = True

    def propose(self, input_ids, k, sampler, generator) -> Draft:
        return Draft.empty(input_ids.shape[0], input_ids.device)
