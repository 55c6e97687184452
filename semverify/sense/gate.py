"""Relaxed exact-match rules for greedy verification: SENSE's soft gate and FLy's deferred window.

Both start from exact matching against the target's greedy choices and rescue some mismatches where
the target itself is unsure. They are lossy; each has an exact-greedy limit (see the classes).
"""

from __future__ import annotations

import math

import torch

from ..rules import (
    BaseRule,
    at_position,
    entropy,
    leading_true,
    one_hot_argmax,
    prefix_mask,
    target_choices,
    token_probs,
)
from ..types import TokenLaw, Verdict, VerifyInput


def isolated_mismatch(exact: torch.BoolTensor, window: int) -> torch.BoolTensor:
    """[B, k] positions t whose forward window [t, t+window-1] fits in the draft and holds no
    mismatch but t's own (FLy's deferred window; SENSE's convolutional confidence with tau = 1/W)."""
    B, k = exact.shape
    if window < 1 or k < window:
        return torch.zeros_like(exact)
    later = torch.nn.functional.pad((~exact).long(), (0, window)).unfold(-1, window - 1, 1)[:, 1 : k + 1]
    ok = later.sum(-1) == 0  # mismatches among t+1 .. t+window-1
    full = torch.arange(k, device=exact.device) <= k - window
    return ok & full


def _kept_with_reasons(gate: torch.BoolTensor, exact: torch.BoolTensor, rescues: dict[str, torch.BoolTensor],
                       x: VerifyInput, choice: torch.LongTensor) -> Verdict:
    """Verdict for the longest gated prefix; each rescued position is credited to its first reason (and
    logged by stats as a substitution of the target's own choice)."""
    n = leading_true(gate)
    kept = prefix_mask(n, x.k)
    reasons = {"exact": kept & exact}
    left = kept & ~exact
    for name, mask in rescues.items():
        reasons[name] = left & mask
        left = left & ~mask
    return Verdict(n, at_position(choice, n), reasons, target_tokens=choice[:, : x.k])


class SoftGate(BaseRule):
    """SENSE's soft-gated evaluation: G = exact OR (H(p)/log|V| > theta_e AND (draft in top-k of p OR an
    isolated mismatch within a window of w)).

    The longest gated prefix is kept and the target's own token follows. "Exact" compares the draft with the
    target's own token: its argmax, or when sampling its draw (so a token outside the rescues is kept with
    probability p(x) and a refusal draws from p without it). The window looks past the position, so with
    ``window > 0`` on drafts as long as the window the rule decides by itself from the target's own tokens, and a
    coupled run draws the draft from noise of its own (``coupling = "own-draft"``); otherwise it states its law.
    theta_e = 1 (a normalised entropy never exceeds 1) reduces it to exact matching, i.e. lossless.
    """

    name = "sense"
    _coupling = "own-draft"

    def __init__(self, theta_e: float = 0.05, top_k: int = 3, window: int = 6) -> None:
        if not 0.0 <= theta_e <= 1.0:
            raise ValueError(f"theta_e is a normalised entropy threshold in [0, 1], got {theta_e}")
        if top_k < 0 or window < 0:
            raise ValueError("top_k and window must be >= 0 (0 switches that rescue off)")
        self.theta_e, self.top_k, self.window = float(theta_e), int(top_k), int(window)
        self.lossless = self.theta_e >= 1.0

    @property
    def states_law(self) -> bool:
        """Without a window the gate is local to each position: the engine draws from its law."""
        return self.window == 0

    @property
    def coupling(self) -> str:
        return "law" if self.states_law else self._coupling

    def rescued(self, x: VerifyInput) -> tuple[torch.BoolTensor, torch.Tensor]:
        """[B, k] positions where the target is uncertain, and [B, k, V] 1.0 at its top-k tokens there."""
        p = token_probs(x)
        uncertain = entropy(p) / math.log(p.shape[-1]) > self.theta_e
        top = torch.zeros_like(p)
        if self.top_k:
            top.scatter_(-1, p.topk(min(self.top_k, p.shape[-1]), dim=-1).indices, 1.0)
        return uncertain, top * uncertain[..., None]

    def law(self, x: VerifyInput) -> TokenLaw:
        _, rescued = self.rescued(x)
        if not x.do_sample:
            return TokenLaw(torch.maximum(one_hot_argmax(x), rescued), reason="topk")
        return TokenLaw(torch.maximum(token_probs(x), rescued), target=0.0, without=1.0, reason="topk")

    def __call__(self, x: VerifyInput) -> Verdict:
        if self.window == 0 or x.k < self.window:  # the window cannot fire: the gate is local
            return super().__call__(x)
        tokens, k = x.draft.tokens, x.k
        choice = target_choices(x)
        exact = tokens == choice[:, :k]
        uncertain, rescued = self.rescued(x)
        in_top = rescued.gather(-1, tokens[..., None]).squeeze(-1).bool()
        isolated = isolated_mismatch(exact, self.window)
        gate = exact | in_top | (uncertain & isolated)
        return _kept_with_reasons(gate, exact, {"topk": in_top, "window": uncertain & isolated}, x, choice)


class DeferredWindow(BaseRule):
    """FLy's loosely speculative verification: a mismatch survives if the target's top-3 entropy there is
    at least ``entropy_threshold`` and the next ``window - 1`` drafted tokens all match exactly.

    The top-3 entropy is -sum over the three likeliest tokens of p log p (full-softmax p), as in FLy's
    code. ``window=0``, or a threshold above log 3 (the most a top-3 entropy can reach), gives exact
    greedy matching.
    """

    name = "fly"
    _coupling = "own-draft"  # the window compares drafts with the target's own tokens past the position

    def __init__(self, entropy_threshold: float = 0.3, window: int = 6) -> None:
        if entropy_threshold < 0 or window < 0:
            raise ValueError("entropy_threshold and window must be >= 0")
        self.entropy_threshold, self.window = float(entropy_threshold), int(window)

    @property
    def min_k(self) -> int:
        """The window is FLy's only rescue: drafts shorter than it leave exact matching."""
        return max(1, self.window)

    def __call__(self, x: VerifyInput) -> Verdict:
        tokens, k = x.draft.tokens, x.k
        choice = target_choices(x)
        exact = tokens == choice[:, :k]
        top3 = x.target_probs[:, :k].topk(min(3, x.target_probs.shape[-1]), dim=-1).values
        unsure = -(top3 * top3.clamp_min(torch.finfo(top3.dtype).tiny).log()).sum(-1) >= self.entropy_threshold
        deferred = unsure & isolated_mismatch(exact, self.window)
        return _kept_with_reasons(exact | deferred, exact, {"window": deferred}, x, choice)
