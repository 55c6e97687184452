"""EASD's acceptance rule: speculative decoding that refuses tokens both models agree on while unsure.

Su, Zhang and He, "Entropy-Aware Speculative Decoding Toward Improved LLM Reasoning" (arXiv 2512.23765).
A draft token that standard SD would accept is rejected anyway when the draft entropy exceeds
``draft_entropy``, the target entropy exceeds ``target_entropy``, and the two top-N sets overlap by at least
``overlap``; the target then emits a token other than the draft's. Lossy by design.
"""

from __future__ import annotations

import math

import torch

from ..rules import BaseRule, entropy, one_hot_argmax, ratio, token_probs
from ..types import TokenLaw, VerifyInput

RESAMPLE = ("target", "residual")


class EntropyAwareRule(BaseRule):
    """Standard SD (ratio test when sampling, argmax match when greedy) plus the EASD penalty.

    Entropies are in nats over the warped distributions the tokens were drawn from (``normalize``
    divides them by log|V|, so thresholds then lie in [0, 1]). The law: where the penalty holds (both models
    uncertain, top-N sets overlapping; a property of the position, not of the token), no token is kept; a token the
    ratio test would have kept (probability min(1, p/q)) is replaced by a draw from the target without it
    (``resample="target"``; greedy: the target's second choice) or from the SD residual of that
    (``resample="residual"``), and a token the test refuses by a draw from (p - q)+, as in SD. Elsewhere it is SD.
    With either threshold at +inf the rule is exactly `SpeculativeSampling`. Coupled runs draw the Gumbel-max of
    its emitted law (closed form for ``resample="target"``; the residual form has none and is refused there).
    """

    name = "easd"
    needs_draft_probs = True

    def __init__(
        self,
        draft_entropy: float,
        target_entropy: float,
        top_n: int = 5,
        overlap: float = 0.6,
        resample: str = "target",
        normalize: bool = False,
        use_entropy: bool = True,
        use_overlap: bool = True,
    ) -> None:
        if math.isnan(draft_entropy) or math.isnan(target_entropy):
            raise ValueError("draft_entropy and target_entropy must be numbers (use float('inf') to switch the "
                             "penalty off)")
        if int(top_n) != top_n or top_n < 1:
            raise ValueError(f"top_n must be a positive integer, got {top_n}")
        if not 0.0 <= overlap <= 1.0:
            raise ValueError(f"overlap must be in [0, 1], got {overlap}")
        if resample not in RESAMPLE:
            raise ValueError(f"resample must be one of {RESAMPLE}, got {resample!r}")
        self.draft_entropy, self.target_entropy = float(draft_entropy), float(target_entropy)
        self.top_n, self.overlap = int(top_n), float(overlap)
        self.resample, self.normalize = resample, bool(normalize)
        self.use_entropy, self.use_overlap = bool(use_entropy), bool(use_overlap)  # the paper's two ablations
        self.lossless = self.use_entropy and (math.isinf(self.draft_entropy) or math.isinf(self.target_entropy))

    def __repr__(self) -> str:
        return (f"EntropyAwareRule(draft_entropy={self.draft_entropy:.4g}, target_entropy={self.target_entropy:.4g}, "
                f"top_n={self.top_n}, "
                f"overlap={self.overlap}, resample={self.resample!r}, normalize={self.normalize}, "
                f"use_entropy={self.use_entropy}, use_overlap={self.use_overlap})")

    def uncertain_agreement(self, q: torch.Tensor, p: torch.Tensor) -> torch.BoolTensor:
        """[B, k] positions where both models are uncertain and their top-N sets overlap enough (with
        ``use_entropy=False`` overlap alone decides, with ``use_overlap=False`` the entropies alone)."""
        h_q, h_p = entropy(q), entropy(p)
        if self.normalize:
            h_q, h_p = h_q / math.log(q.shape[-1]), h_p / math.log(p.shape[-1])
        n = min(self.top_n, q.shape[-1], p.shape[-1])
        top_q, top_p = q.topk(n, dim=-1).indices, p.topk(n, dim=-1).indices
        shared = (top_q[..., :, None] == top_p[..., None, :]).any(dim=-1).sum(dim=-1)
        uncertain = (h_q > self.draft_entropy) & (h_p > self.target_entropy)
        agree = shared >= self.overlap * n - 1e-9
        return ((uncertain if self.use_entropy else torch.ones_like(uncertain))
                & (agree if self.use_overlap else torch.ones_like(agree)))

    def law(self, x: VerifyInput) -> TokenLaw:
        q = x.draft.probs
        if q is None:
            raise ValueError("the easd rule needs the draft distribution q; use a model drafter, not a "
                             "deterministic one (prompt lookup, retrieval)")
        p, q = token_probs(x), q[:, : x.k].float()
        penalised = self.uncertain_agreement(q, p)  # [B, k]
        pen = penalised[..., None]
        labels = {"penalty": penalised}
        if not x.do_sample:  # the argmax is refused where penalised, and the second choice follows
            top = one_hot_argmax(x)
            without = top * pen
            return TokenLaw(top * ~pen, target=1.0 - without, without=without, reason="easd", refusal_labels=labels)
        a = ratio(p, q)
        keep = a * ~pen
        if self.resample == "target":
            return TokenLaw(keep, target=0.0, without=a * pen, residual=1.0 - a * pen, reason="easd",
                            refusal_labels=labels)
        return TokenLaw(keep, target=0.0, residual=1.0, reason="easd", refusal_labels=labels,
                        refuse=lambda at, tok: self._residual_refusal(x, penalised, at, tok),
                        uncoupled="easd with resample='residual' has no closed-form emitted law, so coupled runs "
                                  "cannot draw it; use resample='target' (the default) or an uncoupled run")

    @staticmethod
    def _residual_refusal(x: VerifyInput, penalised: torch.BoolTensor, at: torch.LongTensor,
                          tok: torch.LongTensor) -> torch.Tensor:
        """[B, V] the refusal law of ``resample="residual"`` at positions ``at`` for drafted tokens ``tok``: where
        penalised, (p without x - q)+ for a token SD would keep (else p without x), and (p - q)+ for one it refuses."""
        rows = torch.arange(tok.shape[0], device=tok.device)
        p, q = x.target_probs[rows, at], x.draft.probs[rows, at].float()
        a = ratio(p, q).gather(-1, tok[:, None])
        without = p.scatter(-1, tok[:, None], 0.0)
        penalty = (without - q).clamp_min(0.0)
        penalty = torch.where(penalty.sum(-1, keepdim=True) > 0, penalty, without)
        residual = (p - q).clamp_min(0.0)
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
        mixed = a * penalty / penalty.sum(-1, keepdim=True).clamp_min(1e-30) + (1 - a) * residual / residual.sum(
            -1, keepdim=True).clamp_min(1e-30)
        return torch.where(penalised[rows, at][:, None], mixed, residual)
