"""Per-call speculative decoding statistics, with the metric definitions spelled out."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from .types import StepOutcome


@dataclass
class SpecStats:
    """Counters for one ``generate`` call (batch 1).

    tau = new tokens / target forwards (bonus and correction tokens included, as vLLM and Spec-Bench
    count it; vanilla decoding has tau = 1). alpha = accepted / drafted draft tokens.
    """

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    accept_lengths: list[int] = field(default_factory=list)
    draft_lengths: list[int] = field(default_factory=list)  # tokens drafted at each step (its forward's width)
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    reasons: Counter = field(default_factory=Counter)
    reasons_per_position: dict[str, list[int]] = field(default_factory=dict)
    scores: dict[str, list[float]] = field(default_factory=dict)  # per step, for the steps that gave one
    # kept draft tokens the target would not have chosen: [index among new tokens, reason, kept, target's own]
    substitutions: list[list] = field(default_factory=list)
    draft_time: float = 0.0
    verify_time: float = 0.0
    total_time: float = 0.0
    rows: list["SpecStats"] = field(default_factory=list)  # each row's own, when a batch was decoded

    @classmethod
    def pooled(cls, rows: list["SpecStats"], wall: float) -> "SpecStats":
        """One row's statistics as they are; a batch's pooled: counts added up (tau is then tokens per
        row-step), times those of the batch (``wall``), and every row's own in ``rows``."""
        if len(rows) == 1:
            rows[0].total_time = wall
            return rows[0]
        pooled = cls(total_time=wall, rows=rows)
        for r in rows:
            for name in ("steps", "drafted", "accepted", "new_tokens"):
                setattr(pooled, name, getattr(pooled, name) + getattr(r, name))
            pooled.accept_lengths += r.accept_lengths
            pooled.draft_lengths += r.draft_lengths
            _add_lists(pooled.drafted_per_position, r.drafted_per_position)
            _add_lists(pooled.accepted_per_position, r.accepted_per_position)
            pooled.reasons.update(r.reasons)
            for name, counts in r.reasons_per_position.items():
                _add_lists(pooled.reasons_per_position.setdefault(name, []), counts)
            for name, values in r.scores.items():
                pooled.scores.setdefault(name, []).extend(values)
            pooled.substitutions += r.substitutions
        pooled.draft_time = max((r.draft_time for r in rows), default=0.0)  # the rows share each step's time
        pooled.verify_time = max((r.verify_time for r in rows), default=0.0)
        return pooled

    def record_step(self, outcome: StepOutcome, reasons: dict[str, torch.Tensor], positions: int,
                    draft_time: float = 0.0, verify_time: float = 0.0) -> None:
        """Count one target forward: ``outcome`` (drafted, accepted, emitted), the rule's per-position
        ``reasons`` and per-step scores, and ``positions``, the length of the path the rule judged (a
        chain's is its draft; a tree's, the chosen branch's), which per-position counts follow."""
        self._log_substitutions(outcome, reasons)
        self.steps += 1
        self.drafted += outcome.drafted
        self.accepted += outcome.accepted
        self.new_tokens += outcome.emitted.shape[1]
        self.accept_lengths.append(outcome.accepted)
        self.draft_lengths.append(outcome.drafted)
        self.draft_time += draft_time
        self.verify_time += verify_time
        _add_prefix(self.drafted_per_position, positions)
        _add_prefix(self.accepted_per_position, outcome.accepted)
        for name, mask in reasons.items():
            flags = mask[0].tolist()
            self.reasons[name] += sum(flags)
            per_pos = self.reasons_per_position.setdefault(name, [])
            per_pos.extend([0] * (len(flags) - len(per_pos)))
            for i, flag in enumerate(flags):
                per_pos[i] += int(flag)
        for name, value in outcome.verdict.scores.items():
            self.scores.setdefault(name, []).append(float(value[0]))

    def _log_substitutions(self, outcome: StepOutcome, reasons: dict[str, torch.Tensor]) -> None:
        """Log each kept draft token that differs from the target's own choice (what a lossy rule
        rescued), with the first reason that kept it."""
        choice = outcome.verdict.target_tokens
        if choice is None:
            return
        kept = outcome.emitted[0, : outcome.accepted].tolist()
        for i, (token, own) in enumerate(zip(kept, choice[0].tolist())):
            if token != own:
                why = next((name for name, mask in reasons.items() if name != "exact" and bool(mask[0, i])), "?")
                self.substitutions.append([self.new_tokens + i, why, token, own])

    @property
    def tau(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def other_time(self) -> float:
        return max(0.0, self.total_time - self.draft_time - self.verify_time)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time if self.total_time > 0 else 0.0

    def to_dict(self) -> dict:
        """Plain JSON-ready dict: counters, derived metrics and timings."""
        return {
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "new_tokens": self.new_tokens,
            "tau": self.tau,
            "alpha": self.alpha,
            "accept_lengths": list(self.accept_lengths),
            "draft_lengths": list(self.draft_lengths),
            "acceptance_by_position": self.acceptance_by_position,
            "reasons": dict(self.reasons),
            "reasons_per_position": {k: list(v) for k, v in self.reasons_per_position.items()},
            "scores": {k: list(v) for k, v in self.scores.items()},
            "substitutions": [list(s) for s in self.substitutions],
            "draft_time": self.draft_time,
            "verify_time": self.verify_time,
            "other_time": self.other_time,
            "total_time": self.total_time,
            "tokens_per_second": self.tokens_per_second,
            **({"rows": [r.to_dict() for r in self.rows]} if self.rows else {}),
        }

    def summary(self) -> str:
        """One human-readable line."""
        return (
            f"{self.new_tokens} tokens in {self.total_time:.2f}s ({self.tokens_per_second:.2f} tok/s), "
            f"{self.steps} target forwards, tau={self.tau:.2f}, alpha={self.alpha:.2f} "
            f"({self.accepted}/{self.drafted}), time draft/verify/other="
            f"{self.draft_time:.2f}/{self.verify_time:.2f}/{self.other_time:.2f}s"
        )


def _add_lists(total: list[int], more: list[int]) -> None:
    """total[i] += more[i], growing ``total`` as needed."""
    total.extend([0] * (len(more) - len(total)))
    for i, c in enumerate(more):
        total[i] += c


def _add_prefix(counts: list[int], n: int) -> None:
    """counts[i] += 1 for i < n, growing the list as needed."""
    counts.extend([0] * (n - len(counts)))
    for i in range(n):
        counts[i] += 1
