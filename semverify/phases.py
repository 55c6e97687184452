"""Phases: a token rule limited to a span of the output, with the lossless rule outside it.

``Phased(inner, start="<think>", end="</think>", tokenizer=tok)`` judges draft positions inside the span with
``inner`` and the others with ``lossless`` (`SpeculativeSampling`: exact matching under greedy decoding and
coupled noise), as TensorRT-LLM applies its relaxed acceptance between the thinking-phase tokens only. Method
specs take the span as rule parameters (`limit_to_phase`, called by `semverify.registry.get_rule`):

    relaxed_topk:phase_start=<think>,phase_end=</think>       # between the markers
    relaxed_topk:phase_end=Final Answer                       # from the output's start until the marker
    mars:phase_end=</think>,phase_window=8192                 # the markers searched in the last 8192 tokens

What decides the phase. A rule stays a pure function of its input, so the phase is read from the row's latest
output tokens (``VerifyInput.history``, at least ``window`` of them, filled by the loop since the rule declares
``history_tokens = window``) followed by the draft. A position is in the span when the latest complete start
marker before it (or the output's start, with no ``start``) comes after the latest end marker that began before
it: the start marker's own tokens are outside, and so are the end marker's (the target decides where a phase
ends). Within a draft, positions before a start marker and from an end marker on are outside; the token after
the kept prefix belongs to the phase at its position. Markers are matched as token sequences: text is encoded
with the tokenizer as written and with a leading space (the common variants); an ``int`` is one token id.

Limits. The phase is exact while the output is at most ``window`` tokens long. Beyond that a marker older than
``window`` tokens is forgotten: with ``start`` the span then closes (the lossless rule decides, a safe
default), with only ``end`` it stays open (after a forgotten end marker the relaxation would return). A marker
that the tokenizer splits differently in context, or that a draft ends in the middle of, is found only when it
is complete. Prompt tokens are not searched: when the chat template opens ``<think>`` in the prompt, give
``end`` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .rules import BaseRule, SpeculativeSampling, at_position, decide, prefix_mask
from .types import Draft, TokenLaw, Verdict, VerifyInput

PHASE_PARAMS = ("phase_start", "phase_end", "phase_window", "phase_switch")  # what limits a rule to a span
SWITCHES = ("position", "step")  # where a phase changes: at the marker, or after the step that emitted it
DEFAULT_WINDOW = 4096

Marker = str | int | Sequence[int] | Sequence[str | int | Sequence[int]]


def marker_ids(marker: Marker | None, tokenizer: Any = None, what: str = "marker") -> list[tuple[int, ...]]:
    """The token sequences that mark a phase boundary: text encoded as written and with a leading space (needs
    ``tokenizer``), an int as one token id, a list of ints as one sequence, or a list of those as alternatives."""
    if marker is None:
        return []
    if isinstance(marker, bool):
        raise ValueError(f"{what} must be text, a token id or token ids, got {marker!r}")
    if isinstance(marker, int):
        return [(marker,)]
    if isinstance(marker, str):
        if not marker.strip():
            raise ValueError(f"{what} must not be empty")
        if tokenizer is None:
            raise ValueError(f"{what} {marker!r} is text: it needs the tokenizer (Phased(..., tokenizer=tok), or a "
                             "run that has the target's tokenizer), or give its token ids")
        variants = []
        for text in (marker, " " + marker):
            ids = tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=False))
            if ids and ids not in variants:
                variants.append(ids)
        return variants
    items = list(marker)
    if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [tuple(items)]
    if not items:
        raise ValueError(f"{what} must not be empty")
    return [ids for item in items for ids in marker_ids(item, tokenizer, what) if ids]


def _hits(seq: torch.LongTensor, marker: tuple[int, ...]) -> torch.BoolTensor:
    """[B, L - m + 1] whether the m-token ``marker`` starts at each position of ``seq`` [B, L]."""
    m = len(marker)
    if seq.shape[1] < m:
        return torch.zeros(seq.shape[0], 0, dtype=torch.bool, device=seq.device)
    pattern = torch.tensor(marker, dtype=seq.dtype, device=seq.device)
    return (seq.unfold(1, m, 1) == pattern).all(dim=-1)


def _force(x: VerifyInput, force: torch.BoolTensor) -> VerifyInput:
    """``x`` with the draft positions in ``force`` [B, k] made certain: target and draft both give the draft token
    probability 1 there, so any rule keeps them and judges the positions after them as if they were kept."""
    k, tokens = x.k, x.draft.tokens
    logits = x.target_logits.float()
    hot = torch.full_like(logits[:, :k], float("-inf")).scatter(-1, tokens[..., None], 0.0)
    logits = torch.cat([torch.where(force[..., None], hot, logits[:, :k]), logits[:, k:]], dim=1)
    probs = x.draft.probs
    if probs is not None:
        one = torch.zeros_like(probs).scatter(-1, tokens[..., None], 1.0)
        probs = torch.where(force[..., None], one, probs)
    draft = Draft(tokens, probs, lengths=x.draft.lengths)
    return VerifyInput(draft, logits, x.do_sample, x.target_hidden, x.generator, x.extend, history=x.history,
                       output_lengths=x.output_lengths)


def _governed_before(govern: torch.BoolTensor) -> torch.BoolTensor:
    """[B, k] positions j < k not governed by a rule but before one that is (j < j' <= k, govern [B, k+1])."""
    later = govern[:, 1:].flip(1).long().cumsum(1).flip(1) > 0
    return ~govern[:, :-1] & later


class Phased(BaseRule):
    """``inner`` inside a span of the output (between ``start`` and ``end`` markers), ``lossless`` outside.

    ``switch="step"`` reads the phase once per step, at the draft's first position, as TensorRT-LLM does (it scans
    the tokens a verification step accepted): a marker inside a draft then takes effect from the next step.
    ``start=None``: the span opens at the output's start; ``end=None``: it never closes. Markers: text (with
    ``tokenizer``), a token id, token ids, or a list of alternatives (`marker_ids`). The phase is read from the
    last ``window`` output tokens (``VerifyInput.history``) and the draft; see the module for what decides it
    and its limits. Both rules judge the draft; a position outside a rule's span that comes before one inside it
    is made certain for that rule (`_force`), so each rule's verdict covers its own positions given the kept
    prefix, and the kept prefix is where both agree. Inside the span throughout, the verdict is ``inner``'s
    (its random draws included: it runs first); ``scores["in_phase"]`` is 1 where a row's draft began inside.
    """

    def __init__(self, inner: BaseRule, lossless: BaseRule | None = None, start: Marker | None = None,
                 end: Marker | None = None, tokenizer: Any = None, window: int = DEFAULT_WINDOW,
                 switch: str = "position") -> None:
        if not isinstance(inner, BaseRule):
            raise TypeError(f"inner must be a rule (semverify.rules.BaseRule), got {type(inner).__name__}")
        if inner.needs_extend or inner.preferred_drafter == "step":
            raise ValueError(f"rule {inner.name!r} judges whole reasoning steps; phases limit token rules")
        lossless = SpeculativeSampling() if lossless is None else lossless
        if not isinstance(lossless, BaseRule):
            raise TypeError(f"lossless must be a rule, got {type(lossless).__name__}")
        if start is None and end is None:
            raise ValueError("a phase needs a start marker, an end marker or both (phase_start / phase_end)")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window (phase_window) must be a positive number of tokens, got {window!r}")
        self.inner, self.outside = inner, lossless
        self.start = marker_ids(start, tokenizer, "the phase's start marker (phase_start)")
        self.end = marker_ids(end, tokenizer, "the phase's end marker (phase_end)")
        longest = max(len(m) for m in self.start + self.end)
        if window < longest:
            raise ValueError(f"window (phase_window) {window} is shorter than a marker ({longest} tokens)")
        if switch not in SWITCHES:
            raise ValueError(f"switch (phase_switch) must be one of {', '.join(SWITCHES)}, got {switch!r}")
        self.window, self.switch = window, switch
        self.history_tokens = max(window, inner.history_tokens, lossless.history_tokens)
        self.name = inner.name
        self.lossless = inner.lossless and lossless.lossless
        self.needs_draft_probs = inner.needs_draft_probs or lossless.needs_draft_probs
        self.needs_hidden_states = inner.needs_hidden_states or lossless.needs_hidden_states
        self.preferred_drafter, self.min_k = inner.preferred_drafter, inner.min_k
        self._sources = tuple(inner.artifacts) + tuple(lossless.artifacts)

    def __repr__(self) -> str:
        return f"Phased({self.inner!r}, start={self.start}, end={self.end}, window={self.window})"

    def in_phase(self, x: VerifyInput) -> torch.BoolTensor:
        """[B, k+1] whether each draft position, and the position after the draft, is inside the span."""
        if x.history is None:
            raise ValueError(f"rule {self.name!r} is limited to a phase and needs each row's latest output tokens "
                             "(VerifyInput.history), which this loop did not give")
        tokens = x.draft.tokens
        history = x.history[:, -self.window :].to(device=tokens.device, dtype=tokens.dtype)
        seq = torch.cat([history, tokens], dim=1)
        length = seq.shape[1]
        opened = torch.zeros(seq.shape[0], length + 1, dtype=torch.bool, device=seq.device)
        closed = torch.zeros_like(opened)
        for marker in self.start:  # the span opens after a start marker's last token
            hits = _hits(seq, marker)
            opened[:, len(marker) : len(marker) + hits.shape[1]] |= hits
        for marker in self.end:  # and closes at an end marker's first token
            hits = _hits(seq, marker)
            closed[:, : hits.shape[1]] |= hits
        index = torch.arange(length + 1, device=seq.device).expand_as(opened)
        last_open = torch.where(opened, index, -2).cummax(dim=1).values
        if not self.start:
            last_open = last_open.clamp(min=-1)  # open from the output's start
        last_close = torch.where(closed, index, -2).cummax(dim=1).values
        phase = (last_open > last_close)[:, history.shape[1] :]
        return phase[:, :1].expand_as(phase) if self.switch == "step" else phase

    @property
    def states_law(self) -> bool:
        """Whether both rules state their laws (then the phased rule's law is theirs, position by position)."""
        return self.inner.states_law and self.outside.states_law

    @property
    def coupling(self) -> str | None:
        return "law" if self.states_law else self.inner.coupling

    def law(self, x: VerifyInput) -> TokenLaw:
        """``inner``'s law at the positions inside the span, ``outside``'s elsewhere."""
        return self.inner.law(x).where(self.in_phase(x)[:, : x.k], self.outside.law(x))

    def __call__(self, x: VerifyInput) -> Verdict:
        if self.states_law:
            return decide(self, x)
        k, tokens = x.k, x.draft.tokens
        phase = self.in_phase(x)
        inner = self.inner(_force(x, _governed_before(phase)))
        outside = self.outside(_force(x, _governed_before(~phase)))
        full = torch.full_like(inner.n_accepted, k)
        n_in = torch.where(at_position(phase, inner.n_accepted), inner.n_accepted, full)
        n_out = torch.where(at_position(~phase, outside.n_accepted), outside.n_accepted, full)
        n = torch.minimum(n_in, n_out)
        next_token = torch.where(at_position(phase, n), inner.next_token, outside.next_token)
        kept, inside = prefix_mask(n, k), phase[:, :k]
        reasons: dict[str, torch.Tensor] = {}
        for verdict, where in ((inner, kept & inside), (outside, kept & ~inside)):
            for name, mask in verdict.reasons.items():
                reasons[name] = reasons.get(name, torch.zeros_like(kept)) | (mask & where)
        scores = {**outside.scores, **inner.scores, "in_phase": phase[:, 0].float()}
        target_tokens = None
        if inner.target_tokens is not None or outside.target_tokens is not None:
            own_in = tokens if inner.target_tokens is None else inner.target_tokens
            own_out = tokens if outside.target_tokens is None else outside.target_tokens
            target_tokens = torch.where(inside, own_in, own_out)
        return Verdict(n, next_token, reasons, scores, target_tokens)


def limit_to_phase(rule: BaseRule, context: Any = None, phase_start: Marker | None = None,
                   phase_end: Marker | None = None, phase_window: int | None = None,
                   phase_switch: str = "position") -> BaseRule:
    """``rule`` limited to the span a method spec names (``phase_start``, ``phase_end``: text or a token id;
    ``phase_window``: tokens searched; ``phase_switch``: ``"step"`` to read the phase once per step), the tokenizer
    taken from the run's ``context``."""
    for key, value in (("phase_start", phase_start), ("phase_end", phase_end)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, list, tuple))):
            raise ValueError(f"{key} must be text or a token id, got {value!r}")
    if phase_window is not None and (isinstance(phase_window, bool) or not isinstance(phase_window, int)):
        raise ValueError(f"phase_window expects an integer, got {phase_window!r}")
    tokenizer = getattr(context, "tokenizer", None)
    return Phased(rule, start=phase_start, end=phase_end, tokenizer=tokenizer,
                  window=DEFAULT_WINDOW if phase_window is None else phase_window, switch=phase_switch)


__all__ = ["DEFAULT_WINDOW", "PHASE_PARAMS", "Phased", "limit_to_phase", "marker_ids"]
