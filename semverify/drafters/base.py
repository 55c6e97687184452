"""The base class of drafters, with its no-op hooks and declared abilities, and the empty drafter."""

from __future__ import annotations

import torch

from ..engine.drafting import Batching, Drafter
from ..types import Draft, StepOutcome

__all__ = ["BaseDrafter", "Drafter", "NoDrafter"]


class BaseDrafter:
    """No-op ``reset``, ``commit`` and ``feedback``: a drafter overrides what it needs.

    ``batching`` declares how it serves a batch: ``"rows"``, it drafts every row itself (it implements
    `semverify.engine.drafting.RowDrafter`, as the draft model's chains and trees and the step drafter do);
    ``"copies"``, one copy per row (``copy.copy``; per-sequence state: prompt lookup, retrieval, hybrid);
    ``"single"``, one sequence only (a user's drafter that cannot be copied).
    """

    gives_probs = False
    needs_target_hidden = False
    batching: Batching = "copies"

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
