"""Relaxed exact-match rules for greedy verification: SENSE's soft gate and FLy's deferred window.

Both start from exact matching against the target's greedy choices and rescue some mismatches where
the target itself is unsure. They are lossy; each has an exact-greedy limit (see the classes).
"""

from __future__ import annotations

import math

import torch

from ..rules import BaseRule, at_position, entropy, leading_true, prefix_mask, target_choices
from ..types import Verdict, VerifyInput


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

    The longest gated prefix is kept and the target's own (greedy) token follows. theta_e = 1 (a
    normalised entropy never exceeds 1) reduces it to exact greedy matching, i.e. lossless.
    """

    name = "sense"

    def __init__(self, theta_e: float = 0.05, top_k: int = 3, window: int = 6) -> None:
        if not 0.0 <= theta_e <= 1.0:
            raise ValueError(f"theta_e is a normalised entropy threshold in [0, 1], got {theta_e}")
        if top_k < 0 or window < 0:
            raise ValueError("top_k and window must be >= 0 (0 switches that rescue off)")
        self.theta_e, self.top_k, self.window = float(theta_e), int(top_k), int(window)

    def __call__(self, x: VerifyInput) -> Verdict:
        tokens, k = x.draft.tokens, x.k
        choice = target_choices(x)
        exact = tokens == choice[:, :k]
        p = x.target_probs[:, :k]
        uncertain = entropy(p) / math.log(p.shape[-1]) > self.theta_e
        if self.top_k:
            in_top = (p.topk(min(self.top_k, p.shape[-1]), dim=-1).indices == tokens[..., None]).any(-1)
        else:
            in_top = torch.zeros_like(exact)
        isolated = isolated_mismatch(exact, self.window)
        gate = exact | (uncertain & (in_top | isolated))
        return _kept_with_reasons(gate, exact, {"topk": uncertain & in_top, "window": uncertain & isolated},
                                  x, choice)


class DeferredWindow(BaseRule):
    """FLy's loosely speculative verification: a mismatch survives if the target's top-3 entropy there is
    at least ``entropy_threshold`` and the next ``window - 1`` drafted tokens all match exactly.

    The top-3 entropy is -sum over the three likeliest tokens of p log p (full-softmax p), as in FLy's
    code. ``window=0``, or a threshold above log 3 (the most a top-3 entropy can reach), gives exact
    greedy matching.
    """

    name = "fly"

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
