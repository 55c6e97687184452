"""Tensors that pass between drafter, loop and acceptance rule (batch-first, [B, ...])."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Literal, Protocol

import torch

if TYPE_CHECKING:
    from .engine.noise import Noise


def eos_ids(eos_token_id: int | list[int] | None) -> list[int]:
    """transformers' ``eos_token_id`` (one id, a list of ids, or None) as a list of ids."""
    return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])


DraftKind = Literal["chain", "chains", "tree", "rows"]  # see `Draft.kind`


@dataclass
class Draft:
    """Proposed tokens, and the exact distribution they were sampled from.

    ``probs`` is the warped draft distribution q that ``tokens`` were drawn from; ``None`` marks a
    deterministic proposer (prompt lookup, retrieval), which lossless rules treat as one-hot.
    ``parents`` turns the draft into a tree: ``parents[i]`` is the index of node i's parent, or -1 for
    a child of the last accepted token; ``None`` is a chain (a tree with one path). ``lengths`` [B]:
    how many of each row's tokens are real when rows drafted different numbers (the rest is padding).
    ``rows``: each row's own one-row draft, when the rows of a batch drafted apart (a tree per row, a
    whole step or step tokens per row); its tokens are the row's first ``lengths[b]`` columns, and the
    rule judges each row on it. ``waiting`` marks rows whose draft is not finished yet (a long step draft
    in a batch): they show no tokens, sit out this step's verification, and draft on at the next.
    """

    tokens: torch.LongTensor  # [B, n]
    probs: torch.FloatTensor | None = None  # [B, n, V]
    parents: torch.LongTensor | None = None  # [n]
    lengths: torch.LongTensor | None = None  # [B]
    rows: list[Draft] | None = None  # [B] one-row drafts
    waiting: torch.BoolTensor | None = None  # [B] rows still drafting: no tokens, not verified this step
    _row_lengths: list[int] | None = field(default=None, init=False, repr=False, compare=False)  # `row_lengths`

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"Draft.tokens must be [batch, n], got shape {tuple(self.tokens.shape)}")
        if self.probs is not None and self.probs.shape[:2] != self.tokens.shape:
            raise ValueError(
                f"Draft.probs must be [batch, n, vocab] matching tokens {tuple(self.tokens.shape)}, "
                f"got {tuple(self.probs.shape)}"
            )
        if self.parents is not None:
            n = self.tokens.shape[1]
            if self.parents.shape != (n,) or bool((self.parents >= torch.arange(n, device=self.parents.device)).any()):
                raise ValueError("Draft.parents must be [n] with parents[i] < i (-1 for a root child)")

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    @property
    def kind(self) -> DraftKind:
        """How the batch drafted: ``"chain"`` (every row k tokens, together), ``"chains"`` (together, rows of
        different ``lengths``), ``"tree"`` (one tree for the batch, ``parents``) or ``"rows"`` (each row apart,
        ``rows``: its own chain, tree or step). Orthogonal to ``waiting``, which says which rows are verified."""
        if self.parents is not None:
            return "tree"
        if self.rows is not None:
            return "rows"
        return "chain" if self.lengths is None else "chains"

    def row_lengths(self) -> list[int]:
        """[B] how many real tokens each row drafted (``lengths`` read to the host once per draft)."""
        if self._row_lengths is None:
            self._row_lengths = ([self.length] * self.tokens.shape[0] if self.lengths is None
                                 else self.lengths.tolist())
        return self._row_lengths

    def mask(self) -> torch.BoolTensor:
        """[B, n] which columns hold real tokens (all, unless rows drafted different lengths)."""
        if self.lengths is None:
            return torch.ones_like(self.tokens, dtype=torch.bool)
        return torch.arange(self.length, device=self.tokens.device)[None, :] < self.lengths[:, None]

    @property
    def branches(self) -> bool:
        """Whether any row's draft is a tree (its forward then needs a tree mask)."""
        return self.is_tree or any(r.is_tree for r in self.rows or ())

    def row(self, b: int) -> Draft:
        """Row ``b``'s own draft: as drafted (``rows``), else its real tokens cut from the batch."""
        if self.rows is not None:
            return self.rows[b]
        if self.tokens.shape[0] == 1 and self.lengths is None:
            return self
        n = self.length if self.lengths is None else int(self.lengths[b])
        return Draft(self.tokens[b : b + 1, :n], None if self.probs is None else self.probs[b : b + 1, :n])

    def select(self, rows: list[int]) -> Draft:
        """The draft of the batch rows ``rows`` only, as wide as this one."""
        index = torch.tensor(rows, dtype=torch.long, device=self.tokens.device)
        return Draft(self.tokens[index], None if self.probs is None else self.probs[index], self.parents,
                     None if self.lengths is None else self.lengths[index],
                     None if self.rows is None else [self.rows[i] for i in rows])

    def row_parents(self) -> torch.LongTensor:
        """[B, n] every row's parents (a chain row's node i hangs from node i-1); padding nodes hang from the root."""
        n = self.length
        chain = torch.arange(-1, n - 1)
        if self.rows is None:
            return (chain if self.parents is None else self.parents.cpu())[None].expand(self.tokens.shape[0], n)
        out = torch.full((len(self.rows), n), -1, dtype=torch.long)
        for b, r in enumerate(self.rows):
            out[b, : r.length] = chain[: r.length] if r.parents is None else r.parents.cpu()
        return out

    @classmethod
    def empty(cls, batch_size: int = 1, device: torch.device | str = "cpu") -> "Draft":
        return cls(tokens=torch.empty(batch_size, 0, dtype=torch.long, device=device))


@dataclass
class VerifyInput:
    """What a rule sees for a chain draft of length k.

    ``target_logits`` are the target's logits at the k+1 positions after warping by the same
    sampler that produced ``draft.probs`` (temperature/top-k/top-p); under greedy decoding they are
    the raw logits. ``extend``, where the loop offers it, returns the target's raw logits [B, m, V]
    over m more tokens placed after the draft, without keeping them (SpecReason asks the target a
    question about the step this way).
    """

    draft: Draft
    target_logits: torch.FloatTensor  # [B, k+1, V]
    do_sample: bool
    target_hidden: torch.FloatTensor | None = None  # [B, k+1, H], last layer
    generator: Noise = None  # the rows' noise (`semverify.engine.noise`): a stream, one per row, or coupled
    extend: Callable[[torch.LongTensor], torch.FloatTensor] | None = None
    history: torch.LongTensor | None = None  # [B, L] each row's latest output tokens, right-aligned, -1 before
    output_lengths: torch.LongTensor | None = None  # [B] output tokens each row has so far

    @cached_property
    def target_probs(self) -> torch.FloatTensor:
        return torch.softmax(self.target_logits.float(), dim=-1)

    @property
    def k(self) -> int:
        return self.draft.length


@dataclass
class Verdict:
    """A rule's decision: accept ``n_accepted`` draft tokens, then emit ``next_token``.

    ``reasons`` maps a reason name (``"exact"``, ``"ratio"``, ``"typical"``, ``"penalty"``...) to a
    [B, k] bool mask of the positions it applied to; stats count them per position. ``scores`` maps a
    name to a [B] float the rule computed for this step (SemanticSpec's probe ratio...); stats keep
    each step's value, so a threshold's effect can be read off without rerunning. ``target_tokens``
    ([B, k], set by rules that may keep a draft token the target would not have chosen) is the target's
    own choice at each position; stats log every kept token that differs from it (a substitution).
    """

    n_accepted: torch.LongTensor  # [B]
    next_token: torch.LongTensor  # [B]
    reasons: dict[str, torch.BoolTensor] = field(default_factory=dict)
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    target_tokens: torch.LongTensor | None = None


REFUSALS = ("target", "without", "residual", "draft")  # the laws a refusal mixes (see `TokenLaw`)


@dataclass
class TokenLaw:
    """What a token rule decides at each drafted position of a chain, as laws; the engine draws from them.

    At position i, with p the target's warped distribution, q the draft's (one-hot on the drafted token for a
    deterministic drafter) and y any candidate token:
    ``keep`` [B, k, V] is a(y), the probability of keeping y had it been drafted (0 or 1 under greedy decoding);
    the refused token follows r_y = the mixture, with weights ``target``, ``without``, ``residual`` and ``draft``
    (each [B, k, V] over the candidate y, or a number; summing to 1), of p, p without y, (p - q)+ and q, each
    normalised (greedy decoding: the mixture's argmax). The emitted law is then
    mu = sum_y q(y) [a(y) 1{. = y} + (1 - a(y)) r_y], which the engine draws under coupled noise.
    ``refuse``: a rule whose refusal is not such a mixture gives it here, (position n [B], token [B]) -> [B, V]
    weights, and ``uncoupled`` says why it has no stated emitted law (coupled runs refuse it with that line).
    ``reason`` names what keeps a token the target would not have chosen; ``labels`` [B, k] narrow it by position
    (the first that holds names it); ``refusal_labels`` [B, k] name a refusal of a token the lossless rule would
    have kept there (EASD's penalty).
    """

    keep: torch.FloatTensor  # [B, k, V]
    target: torch.Tensor | float = 1.0  # [B, k, V] or a number
    without: torch.Tensor | float = 0.0
    residual: torch.Tensor | float = 0.0
    draft: torch.Tensor | float = 0.0
    reason: str = "relaxed"
    labels: dict[str, torch.BoolTensor] = field(default_factory=dict)  # [B, k] each
    refusal_labels: dict[str, torch.BoolTensor] = field(default_factory=dict)  # [B, k] each
    refuse: Callable[[torch.LongTensor, torch.LongTensor], torch.Tensor] | None = None
    uncoupled: str | None = None

    def where(self, mask: torch.BoolTensor, other: "TokenLaw") -> "TokenLaw":
        """This law at the positions of ``mask`` [B, k], ``other``'s elsewhere (a rule limited to a phase)."""
        if self.refuse is not None or other.refuse is not None:
            raise ValueError("laws with a custom refusal cannot be merged by position")
        m = mask[..., None]
        pick = {name: torch.where(m, torch.as_tensor(getattr(self, name)), torch.as_tensor(getattr(other, name)))
                .expand_as(self.keep) for name in ("keep", *REFUSALS)}
        labels = {**{n: v & ~mask for n, v in other.labels.items()}, **{n: v & mask for n, v in self.labels.items()}}
        refusal = {**{n: v & ~mask for n, v in other.refusal_labels.items()},
                   **{n: v & mask for n, v in self.refusal_labels.items()}}
        return TokenLaw(**pick, reason=self.reason, labels=labels, refusal_labels=refusal,
                        uncoupled=self.uncoupled or other.uncoupled)


class Judge(Protocol):
    """What the engine sees of an acceptance rule (`semverify.rules.BaseRule` is one): what it reads, a chain's
    verdict and a tree's path, and how coupled runs may draw for it (``coupling``: ``"law"``, the engine draws
    from the rule's `TokenLaw`; ``"own-draft"``, the rule decides from the target's own coupled tokens and the
    draft draws from noise of its own; ``None``, coupled runs refuse it)."""

    name: str
    lossless: bool
    coupling: str | None
    needs_draft_probs: bool
    needs_hidden_states: bool
    needs_extend: bool
    history_tokens: int

    def __call__(self, x: VerifyInput) -> Verdict:
        """The verdict on a chain draft: ``x.draft.tokens`` [B, k], ``x.target_logits`` [B, k+1, V] ->
        ``n_accepted`` [B], ``next_token`` [B], ``reasons`` {name: [B, k]}."""

    def verify_tree(self, x: VerifyInput) -> tuple[list[int], Verdict]:
        """One row's tree draft (``x.draft.parents`` [n], ``x.target_logits`` [1, n+1, V]): the judged path (node
        indices, root to leaf) and its verdict."""


@dataclass(frozen=True)
class StepOutcome:
    """What one loop step did, handed to ``Drafter.feedback`` (adaptive draft lengths learn from it)."""

    drafted: int
    accepted: int
    emitted: torch.LongTensor  # [B, m] the tokens added to the sequence
    verdict: Verdict
