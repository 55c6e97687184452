"""The rows of a batch as the loop keeps them: their tokens in one device buffer, what each step emits into
it, and their statistics."""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import StoppingCriteriaList

from ..stats import SpecStats
from ..types import StepOutcome, Verdict
from .noise import Noise, at_offset
from .step import Step


class Emitted(NamedTuple):
    """What one step adds to a row: its accepted draft tokens then the rule's token, cut at a stop."""

    tokens: list[int]
    accepted: int  # draft tokens among ``tokens``
    reasons: dict[str, torch.BoolTensor]  # the row's reasons as [1, positions] masks (host)
    ended: bool  # an EOS or a stopping criterion ended the row


class Limits(NamedTuple):
    """When a row stops: after ``max_new_tokens``, after an ``eos`` token (as transformers), or at the first token
    after which ``stopping_criteria`` hold."""

    max_new_tokens: int
    eos: set[int]
    stopping_criteria: StoppingCriteriaList | None = None


class Rows:
    """The rows still generating: their tokens in one device buffer (each row's prompt, then its output, from
    column 0), their lengths on the host, random streams and statistics. A step reads each row's sequence as a
    view of the buffer and writes what it emits in one copy, so no step rebuilds a sequence; rows that finish
    leave the batch and keep their output by batch index."""

    def __init__(self, prompts: list[torch.LongTensor], noise: list[Noise], device: torch.device,
                 limits: Limits) -> None:
        """Rows of ``prompts`` [T_b] (no padding), each with its ``noise``, in a [B, longest + 64] buffer."""
        self.lengths = [len(p) for p in prompts]
        self.starts = list(self.lengths)  # where each row's output begins
        self.tokens = torch.zeros(len(prompts), max(self.lengths) + 64, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):
            self.tokens[row, : len(prompt)] = prompt
        self.index = list(range(len(prompts)))  # each row's index in the batch
        self.all_stats = [SpecStats() for _ in prompts]
        self.noise, self.stats = list(noise), list(self.all_stats)
        self.limits = limits
        self.done: dict[int, torch.LongTensor] = {}  # finished rows' outputs, by batch index

    def __len__(self) -> int:
        return len(self.lengths)

    def new(self, row: int) -> int:
        """How many tokens ``row`` has generated."""
        return self.lengths[row] - self.starts[row]

    def begin(self, k: int, history_tokens: int) -> tuple[list[int], list[torch.LongTensor], list[Noise],
                                                           tuple[torch.LongTensor, torch.LongTensor] | None]:
        """What a step starts from: each row's draft length (k, leaving room in its budget for the token the target
        adds), its sequence [T_b] (a view of the buffer), its noise at its next output position, and the output
        tails a rule reading ``history_tokens`` gets (`history`)."""
        ks = [min(k, self.limits.max_new_tokens - self.new(row) - 1) for row in range(len(self))]
        sequences = [self.tokens[row, :length] for row, length in enumerate(self.lengths)]
        noise = [at_offset(g, self.new(row), seq) for row, (g, seq) in enumerate(zip(self.noise, sequences))]
        return ks, sequences, noise, self.history(history_tokens)

    def going(self, ended: list[bool]) -> list[int]:
        """The rows that generate on: not ``ended`` by a stop, and within their token budget."""
        return [i for i in range(len(self)) if not ended[i] and self.new(i) < self.limits.max_new_tokens]

    def history(self, width: int) -> tuple[torch.LongTensor, torch.LongTensor] | None:
        """The last ``width`` (L) output tokens of each row [B, L], right-aligned (-1 before a row's output), and
        each row's output length [B]: what a rule reading the output's tail gets (None when it reads none)."""
        if not width:
            return None
        lengths = torch.tensor(self.lengths, device=self.tokens.device)
        starts = torch.tensor(self.starts, device=self.tokens.device)
        columns = lengths[:, None] - width + torch.arange(width, device=lengths.device)
        tail = self.tokens.gather(1, columns.clamp_min(0))
        return tail.masked_fill(columns < starts[:, None], -1), lengths - starts

    def add(self, step: Step, tokens: torch.LongTensor, verdict: Verdict, times: tuple[float, float, float]
            ) -> tuple[list[Emitted], list[StepOutcome]]:
        """Add to each ready row its accepted path and the rule's token (``tokens`` [R, n], ``verdict``: the ready
        rows' draft tokens and verdict, on the host), cut at a stop (`Limits`: nothing after it is emitted, nor
        counted as accepted), and count the step (``times``: draft, verify, total). Returns what each ready row
        emitted and its outcome."""
        emitted = []
        for i, path in enumerate(step.paths):
            n = int(verdict.n_accepted[i])
            new = [*tokens[i, path[:n]].tolist(), int(verdict.next_token[i])]
            end = next((j + 1 for j, t in enumerate(new) if t in self.limits.eos), None)
            judged = min(len(path), end or len(path))  # positions up to an EOS
            reasons = {name: mask[i : i + 1, :judged] for name, mask in verdict.reasons.items()}
            emitted.append(Emitted(new[:end], min(n, end or n), reasons, end is not None))
        self._write([(row, e.tokens) for row, e in zip(step.ready, emitted)])
        if self.limits.stopping_criteria:
            emitted = [self._stop(row, e) for row, e in zip(step.ready, emitted)]
        return emitted, self._record(step, verdict, emitted, times)

    def _write(self, pieces: list[tuple[int, list[int]]]) -> None:
        """Append each row's new tokens to the buffer in one copy (growing it by doubling when full)."""
        width = max(self.lengths[row] + len(new) for row, new in pieces)
        if width > self.tokens.shape[1]:
            grown = self.tokens.new_zeros(len(self), max(width, 2 * self.tokens.shape[1]))
            grown[:, : self.tokens.shape[1]] = self.tokens
            self.tokens = grown
        rows = [row for row, new in pieces for _ in new]
        columns = [self.lengths[row] + j for row, new in pieces for j in range(len(new))]
        values = torch.tensor([t for _, new in pieces for t in new], dtype=torch.long)
        self.tokens[rows, columns] = values.to(self.tokens.device, non_blocking=True)
        for row, new in pieces:
            self.lengths[row] += len(new)

    def _stop(self, row: int, e: Emitted) -> Emitted:
        """``e`` cut after its first token after which the stopping criteria hold (they see the row's buffer, no
        copy)."""
        criteria, before = self.limits.stopping_criteria, self.lengths[row] - len(e.tokens)
        for j in range(1, len(e.tokens) + 1):
            if bool(criteria(self.tokens[row : row + 1, : before + j], None).any()):
                self.lengths[row] = before + j
                return Emitted(e.tokens[:j], min(e.accepted, j), {k: m[:, :j] for k, m in e.reasons.items()}, True)
        return e

    def _record(self, step: Step, verdict: Verdict, emitted: list[Emitted], times: tuple[float, float, float]
                ) -> list[StepOutcome]:
        """Count the step in the ready rows' statistics (``verdict`` theirs, on the host); a waiting row only spent
        the draft time. Returns the ready rows' outcomes."""
        draft_time, verify_time, total_time = times
        lengths = step.x.draft.row_lengths()
        outcomes = []
        for i, (row, e) in enumerate(zip(step.ready, emitted)):
            outcomes.append(StepOutcome(lengths[i], e.accepted, torch.tensor([e.tokens]), _row(verdict, i)))
            self.stats[row].record_step(outcomes[-1], e.reasons, len(step.paths[i]), draft_time=draft_time,
                                        verify_time=verify_time)
        for row, stats in enumerate(self.stats):
            stats.draft_time += 0.0 if row in step.ready else draft_time
            stats.total_time = total_time
        return outcomes

    def keep(self, going: list[int]) -> None:
        """Only the rows at these indices generate on; the others' outputs are kept."""
        for row in set(range(len(self))) - set(going):
            self.done[self.index[row]] = self.tokens[row, self.starts[row] : self.lengths[row]].clone()
        self.tokens = self.tokens[torch.tensor(going, dtype=torch.long, device=self.tokens.device)]
        self.lengths, self.starts = [self.lengths[i] for i in going], [self.starts[i] for i in going]
        self.index, self.noise = [self.index[i] for i in going], [self.noise[i] for i in going]
        self.stats = [self.stats[i] for i in going]

    def padded(self, input_ids: torch.LongTensor, pad_token_id: int | None) -> torch.LongTensor:
        """``input_ids`` [B, T] (the caller's batch) followed by each row's new tokens, right-padded to the longest:
        [B, T + longest output] (as transformers returns)."""
        outputs = dict(self.done)
        for row, index in enumerate(self.index):
            outputs[index] = self.tokens[row, self.starts[row] : self.lengths[row]]
        width = max(len(t) for t in outputs.values())
        out = torch.full((input_ids.shape[0], width), 0 if pad_token_id is None else pad_token_id, dtype=torch.long,
                         device=input_ids.device)
        for index, tokens in outputs.items():
            out[index, : len(tokens)] = tokens
        return torch.cat([input_ids, out], dim=1)


def to_host(tokens: torch.LongTensor, verdict: Verdict) -> tuple[torch.LongTensor, Verdict]:
    """The ready rows' draft ``tokens`` [B, n] and ``verdict`` on the host, in one device-to-host copy (two with
    scores): all the bookkeeping of a step reads."""
    reasons, target = list(verdict.reasons.items()), verdict.target_tokens
    parts = [verdict.n_accepted[:, None], verdict.next_token[:, None], tokens, *(m.long() for _, m in reasons),
             *([] if target is None else [target])]
    host = torch.cat(parts, dim=1).cpu().split([p.shape[1] for p in parts], dim=1)
    scores = dict(zip(verdict.scores, torch.stack(list(verdict.scores.values())).cpu())) if verdict.scores else {}
    masks = {name: mask.bool() for (name, _), mask in zip(reasons, host[3:])}
    return host[2], Verdict(host[0][:, 0], host[1][:, 0], masks, scores, host[-1] if target is not None else None)


def _row(verdict: Verdict, row: int) -> Verdict:
    """One row of a batch verdict."""
    return Verdict(verdict.n_accepted[row : row + 1], verdict.next_token[row : row + 1],
                   {k: v[row : row + 1] for k, v in verdict.reasons.items()},
                   {k: v[row : row + 1] for k, v in verdict.scores.items() if not bool(v[row].isnan())},
                   None if verdict.target_tokens is None else verdict.target_tokens[row : row + 1])
