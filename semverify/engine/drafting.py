"""How the loop drives drafters: the single-sequence and batch protocols, and a batch served by one copy
of a single-sequence drafter per row."""

from __future__ import annotations

import copy
from typing import Literal, Protocol, runtime_checkable

import torch

from ..types import Draft, StepOutcome
from .noise import Noise
from .sampling import Sampler

Batching = Literal["rows", "copies", "single"]  # how a drafter serves a batch (see BaseDrafter)


@runtime_checkable
class Drafter(Protocol):
    """Proposes up to k tokens after a sequence and keeps its own state in step with the loop.

    ``gives_probs``: whether drafts carry the q they were sampled from. ``needs_target_hidden``:
    whether ``commit`` wants the target's last-layer hidden states of the verified positions.
    ``batching``: how it serves a batch (see `BaseDrafter`).
    """

    gives_probs: bool
    needs_target_hidden: bool
    batching: Batching

    def reset(self, input_ids: torch.LongTensor) -> None:
        """Start a new generation from the prompt ``input_ids`` [1, T]."""

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler, generator: Noise) -> Draft:
        """Up to k tokens (a [1, n] draft, n <= k, or a tree at most k deep) to follow ``input_ids`` [1, T]
        (everything emitted so far); draws come from ``generator``, the row's noise (`semverify.engine.noise`)."""

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden: torch.Tensor | None = None
               ) -> None:
        """The loop kept the first ``n_accepted`` tokens of the last draft's path, then ``next_token`` [1];
        ``target_hidden`` [1, 1 + path length, H]: the target's last hidden states at the root and along the
        judged path, of which the first 1 + ``n_accepted`` were kept (when ``needs_target_hidden``)."""

    def feedback(self, outcome: StepOutcome) -> None:
        """How the last step went, after ``commit``: where adaptive draft lengths learn."""


@runtime_checkable
class RowDrafter(Protocol):
    """What the loop drives: a drafter for every row of a batch at once (rows keep their own state, and
    leave the batch with ``keep_rows``). `row_drafter` makes one of any `Drafter`."""

    gives_probs: bool
    needs_target_hidden: bool

    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        """Start each row from its prompt ([T_b], no padding)."""

    def propose_rows(self, sequences: list[torch.LongTensor], ks: list[int], sampler: Sampler,
                     generators: list[Noise]) -> Draft:
        """Up to ``ks[b]`` tokens after each row's sequence ([T_b], no padding), with each row's noise: a [B, n]
        draft padded to one width with its ``lengths`` [B]."""

    def commit_rows(self, accepted: list[int | None], next_tokens: torch.LongTensor,
                    target_hidden: list[torch.Tensor | None]) -> None:
        """Each row kept its first ``accepted[b]`` draft tokens, then ``next_tokens[b]`` ([B]); ``target_hidden[b]``
        [1, 1 + path length, H] (root and judged path) or None. ``accepted[b]`` None: the row's draft was
        ``Draft.waiting`` and nothing was verified (only a drafter that leaves rows waiting sees it)."""

    def feedback_rows(self, outcomes: list[StepOutcome | None]) -> None:
        """How the last step went for each row (None for a row that waited)."""

    def keep_rows(self, rows: list[int]) -> None:
        """Only the rows at these indices generate on."""


class PerRowDrafter:
    """A batch drafted row by row: one single-sequence drafter per row (prompt lookup and retrieval
    draft this way; their state is per row). Drafts are padded to one width, with their ``lengths``.
    With one row, the drafter's own draft passes through as it is (a tree included)."""

    def __init__(self, drafters: list) -> None:
        self.drafters = drafters
        self.gives_probs = all(d.gives_probs for d in drafters)
        self.needs_target_hidden = any(d.needs_target_hidden for d in drafters)

    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        """Reset each row's drafter with its prompt [T_b] (as [1, T_b])."""
        for drafter, prompt in zip(self.drafters, prompts):
            drafter.reset(prompt[None])

    def propose_rows(self, sequences: list[torch.LongTensor], ks: list[int], sampler: Sampler,
                     generators: list) -> Draft:
        """Each row's drafter proposes after its sequence [T_b]; one row's draft as it is, else a [B, n] draft padded
        to one width (`pad_drafts`)."""
        drafts = [d.propose(s[None], k, sampler, g) if k > 0 else Draft.empty(1, s.device)
                  for d, s, k, g in zip(self.drafters, sequences, ks, generators)]
        return drafts[0] if len(drafts) == 1 else pad_drafts(drafts)

    def commit_rows(self, accepted: list[int], next_tokens: torch.LongTensor,
                    target_hidden: list[torch.Tensor | None]) -> None:
        """Commit each row's drafter: ``accepted[b]``, ``next_tokens[b]`` ([B]), ``target_hidden[b]`` [1, 1 + path
        length, H] (root, then the judged path) or None."""
        for drafter, n, token, hidden in zip(self.drafters, accepted, next_tokens, target_hidden):
            drafter.commit(n, token[None], hidden)

    def feedback_rows(self, outcomes: list[StepOutcome]) -> None:
        for drafter, outcome in zip(self.drafters, outcomes):
            drafter.feedback(outcome)

    def keep_rows(self, rows: list[int]) -> None:
        self.drafters = [self.drafters[i] for i in rows]


def row_drafter(drafter: Drafter, batch: int) -> RowDrafter:
    """The drafter as a batch of rows: itself when it drafts rows together (a draft model), else one
    copy per row of a single-sequence drafter (prompt lookup, retrieval), or itself for one row."""
    if batch == 1:
        return PerRowDrafter([drafter])
    if drafter.batching == "rows":
        return drafter
    if drafter.batching == "single":
        raise NotImplementedError(f"{type(drafter).__name__} drafts one sequence at a time; decode with batch "
                                  "size 1 (or use assistant_model= for token drafts)")
    return PerRowDrafter([copy.copy(drafter) for _ in range(batch)])


def pad_drafts(drafts: list[Draft]) -> Draft:
    """One draft [B, max length] from one-row drafts (chains, trees, steps), with each row's length and
    the row drafts themselves (`Draft.rows`), which the rule judges row by row."""
    width, device = max(d.length for d in drafts), drafts[0].tokens.device
    tokens = torch.zeros(len(drafts), width, dtype=torch.long, device=device)
    for row, d in enumerate(drafts):
        tokens[row, : d.length] = d.tokens[0]
    probs = None
    if width and all(d.probs is not None or d.length == 0 for d in drafts):
        vocab = next(d.probs.shape[-1] for d in drafts if d.probs is not None)
        probs = torch.zeros(len(drafts), width, vocab, device=device)
        for row, d in enumerate(drafts):
            if d.length:
                probs[row, : d.length] = d.probs[0]
    return Draft(tokens, probs, lengths=torch.tensor([d.length for d in drafts], device=device), rows=list(drafts))
