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

    def feedback_rows(self, outcomes: list[StepOutcome]) -> None:
        """A batch drafter hears each row's outcome."""
        for outcome in outcomes:
            self.feedback(outcome)


class NoDrafter(BaseDrafter):
    """Proposes nothing: the loop then decodes one target token per forward (the vanilla baseline)."""

    gives_probs = True

    def propose(self, input_ids, k, sampler, generator) -> Draft:
        return Draft.empty(input_ids.shape[0], input_ids.device)


class PerRowDrafter:
    """A batch drafted row by row: one single-sequence drafter per row (prompt lookup and retrieval
    draft this way; their state is per row). Drafts are padded to one width, with their ``lengths``.
    With one row, the drafter's own draft passes through as it is (a tree included)."""

    def __init__(self, drafters: list) -> None:
        self.drafters = drafters
        self.gives_probs = all(d.gives_probs for d in drafters)
        self.needs_target_hidden = any(d.needs_target_hidden for d in drafters)

    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        for drafter, prompt in zip(self.drafters, prompts):
            drafter.reset(prompt[None])

    def propose_rows(self, sequences: list[torch.LongTensor], ks: list[int], sampler: Sampler,
                     generators: list) -> Draft:
        drafts = [d.propose(s[None], k, sampler, g) if k > 0 else Draft.empty(1, s.device)
                  for d, s, k, g in zip(self.drafters, sequences, ks, generators)]
        if len(drafts) == 1:
            return drafts[0]
        if any(d.is_tree for d in drafts):
            raise NotImplementedError("tree drafts are verified for batch size 1 only; decode the prompts one at "
                                      "a time")
        return pad_drafts(drafts)

    def commit_rows(self, accepted: list[int], next_tokens: torch.LongTensor,
                    target_hidden: list[torch.Tensor | None]) -> None:
        for drafter, n, token, hidden in zip(self.drafters, accepted, next_tokens, target_hidden):
            drafter.commit(n, token[None], hidden)

    def feedback_rows(self, outcomes: list[StepOutcome]) -> None:
        for drafter, outcome in zip(self.drafters, outcomes):
            drafter.feedback(outcome)

    def keep_rows(self, rows: list[int]) -> None:
        self.drafters = [self.drafters[i] for i in rows]


def pad_drafts(drafts: list[Draft]) -> Draft:
    """One chain draft [B, max length] from one-row chain drafts, with each row's length."""
    width = max(d.length for d in drafts)
    tokens = torch.zeros(len(drafts), width, dtype=torch.long)
    for row, d in enumerate(drafts):
        tokens[row, : d.length] = d.tokens[0]
    probs = None
    if width and all(d.probs is not None or d.length == 0 for d in drafts):
        vocab = next(d.probs.shape[-1] for d in drafts if d.probs is not None)
        probs = torch.zeros(len(drafts), width, vocab)
        for row, d in enumerate(drafts):
            if d.length:
                probs[row, : d.length] = d.probs[0]
    return Draft(tokens, probs, lengths=torch.tensor([d.length for d in drafts]))
