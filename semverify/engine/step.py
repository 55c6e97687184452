"""One step of the loop as a value: what the target has not seen (`Unseen`) and the step's state (`Step`), which the
loop's phases fill and read instead of passing loose arguments (see the glossary in `semverify.engine`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..types import Draft, Verdict, VerifyInput


class Unseen(NamedTuple):
    """What the target has not seen yet, per row, left-padded: the prompts, then each step's last token (and a
    waiting row's tokens until its draft is verified). They enter the cache before the step's draft."""

    tokens: torch.LongTensor  # [B, u]
    valid: torch.BoolTensor  # [B, u] which columns are real


@dataclass
class Step:
    """One step's state, filled phase by phase: the draft (1. `propose`), what the rule saw and its verdict
    (2. `verify`); `settle` (3.) reads it. Indices are rows of the current batch."""

    draft: Draft  # [B, n] each row's draft (see `Draft.kind`)
    ready: list[int]  # the rows verified this step (a row still drafting a long step waits)
    sequences: list[torch.LongTensor]  # [T_b] each row's prompt and output so far (views of `Rows.tokens`)
    noise: list  # each row's noise at its next output position (`semverify.engine.noise`)
    unseen: Unseen  # what the target has not seen; the draft enters the cache after it
    tail: tuple[torch.LongTensor, torch.LongTensor] | None = None  # the rows' output tails (`Rows.history`)
    start: int = 0  # the cache column where the draft's first token enters
    x: VerifyInput | None = None  # what the rule saw: the ready rows
    paths: list[list[int]] = field(default_factory=list)  # each ready row's judged path (draft node indices)
    verdict: Verdict | None = None  # the rule's verdict over the ready rows (on the device)

    @property
    def all_ready(self) -> bool:
        """Whether every row is verified this step (no row is still drafting a long step)."""
        return self.draft.waiting is None

    def unseen_after(self, going: list[int]) -> Unseen:
        """What the target has not seen, for the rows ``going`` on: each ready row's new token; a row that waited
        for its draft keeps its unseen tokens."""
        next_token, (tokens, valid) = self.verdict.next_token, self.unseen
        if self.all_ready:
            return Unseen(next_token[going, None], torch.ones(len(going), 1, dtype=torch.bool, device=tokens.device))
        rows = [tokens[i, valid[i]] for i in range(len(tokens))]
        for i, token in zip(self.ready, next_token):
            rows[i] = token[None]
        return Unseen(*left_pad([rows[i] for i in going]))


def left_pad(tokens: list[torch.LongTensor]) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """Rows of different lengths as one left-padded [B, W] batch, and which columns are real."""
    width = max((len(t) for t in tokens), default=0)
    out = torch.zeros(len(tokens), width, dtype=torch.long, device=tokens[0].device if tokens else None)
    valid = torch.zeros(len(tokens), width, dtype=torch.bool, device=out.device)
    for row, t in enumerate(tokens):
        out[row, width - len(t) :], valid[row, width - len(t) :] = t, True
    return out, valid
