"""EASD's acceptance rule: speculative decoding that refuses tokens both models agree on while unsure.

Su, Zhang and He, "Entropy-Aware Speculative Decoding Toward Improved LLM Reasoning" (arXiv 2512.23765).
A draft token that standard SD would accept is rejected anyway when the draft entropy exceeds
``draft_entropy``, the target entropy exceeds ``target_entropy``, and the two top-N sets overlap by at least
``overlap``; the target then emits a token other than the draft's. Lossy by design.
"""

from __future__ import annotations

import math

import torch

from ..engine.argmax import vocab_argmax
from ..engine.coupling import RESAMPLE_STREAM, is_coupled
from ..engine.sampling import sample_from
from ..rules import (
    BaseRule,
    SpeculativeSampling,
    at_position,
    draw_after,
    entropy,
    leading_true,
    prefix_mask,
    ratio_test,
    target_choices,
)
from ..types import Verdict, VerifyInput

RESAMPLE = ("target", "residual")


class EntropyAwareRule(BaseRule):
    """Standard SD (ratio test when sampling, argmax match when greedy) plus the EASD penalty.

    Entropies are in nats over the warped distributions the tokens were drawn from (``normalize``
    divides them by log|V|, so thresholds then lie in [0, 1]). After a penalty the token comes from
    the target with the draft token removed (``resample="target"``; greedy: the target's second
    choice) or from the SD residual of that distribution (``resample="residual"``). With either
    threshold at +inf the rule is exactly `SpeculativeSampling`. Under coupled noise
    (`semverify.engine.coupling`) acceptance is drafter-invariant (a draft token is kept while it equals the
    coupled target token) instead of min(1, p/q), and the penalty's resample is the Gumbel-max of the
    target's distribution without the draft token under a second noise stream.
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

    def __call__(self, x: VerifyInput) -> Verdict:
        q = x.draft.probs
        if x.k == 0:  # nothing drafted (an early-stopped or budget-capped step): the target's own token
            verdict = SpeculativeSampling()(x)
            verdict.reasons["penalty"] = torch.zeros_like(x.draft.tokens, dtype=torch.bool)
            return verdict
        if q is None:
            raise ValueError("the easd rule needs the draft distribution q; use a model drafter, not a "
                             "deterministic one (prompt lookup, retrieval)")
        tokens, k = x.draft.tokens, x.k
        coupled = is_coupled(x.generator)
        if x.do_sample and not coupled:
            accept, reason = ratio_test(x), "ratio"
        else:  # greedy, or coupled: the target's own token decides (drafter-invariant acceptance)
            choice = target_choices(x)
            accept, reason = tokens == choice[:, :k], "exact"
        n_sd = leading_true(accept)
        n = leading_true(accept & ~self.uncertain_agreement(q, x.target_probs[:, :k]))
        penalised = n < n_sd
        if bool(penalised.all()):  # (batch 1) only the penalty's draw is made
            next_token = self._penalty_token(x, n)
        else:
            next_token = draw_after(x, n) if x.do_sample and not coupled else at_position(choice, n)
            if bool(penalised.any()):
                next_token = torch.where(penalised, self._penalty_token(x, n), next_token)
        penalty = prefix_mask(n + 1, k) & ~prefix_mask(n, k) & penalised[:, None]
        return Verdict(n, next_token, {reason: prefix_mask(n, k), "penalty": penalty})

    def _penalty_token(self, x: VerifyInput, n: torch.LongTensor) -> torch.LongTensor:
        """The target's token at position n with the draft token there excluded."""
        at = n.clamp(max=x.k - 1)
        drafted = at_position(x.draft.tokens, at)[:, None]
        if not x.do_sample:
            return vocab_argmax(at_position(x.target_logits, n).scatter(-1, drafted, float("-inf")))
        p_n = at_position(x.target_probs, n)
        without = p_n.scatter(-1, drafted, 0.0)
        if self.resample == "residual":
            res = (without - at_position(x.draft.probs, at)).clamp_min(0.0)
            without = torch.where(res.sum(-1, keepdim=True) > 0, res, without)
        return sample_from(torch.where(without.sum(-1, keepdim=True) > 0, without, p_n), x.generator, positions=n,
                           stream=RESAMPLE_STREAM, tokens=x.draft.tokens)
