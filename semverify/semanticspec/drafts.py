"""The drafts of step rules: a whole reasoning step, or tokens while the target writes a step itself."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..types import Draft


@dataclass
class StepDraft(Draft):
    """A whole reasoning step proposed at once (SemanticSpec and the other step rules).

    ``pooled_hidden`` [B, H] is the mean last-layer state of the draft positions that emitted the
    step's tokens, the draft probe's input.
    """

    pooled_hidden: torch.FloatTensor | None = None


@dataclass
class StepTokensDraft(Draft):
    """Tokens a step drafter proposes while the target writes a step itself (the first step, and any
    step after a rejection): step rules verify them token by token."""
