"""What every step-level rule shares: a drafted step is accepted whole or not at all, a token veto can
refuse it first, and the tokens the draft proposes while the target writes a step are verified token
by token. A rule says only how it judges a step (`StepRule.judge`)."""

from __future__ import annotations

import torch

from ..rules import BaseRule, SpeculativeSampling, at_position, prefix_mask, target_choices
from ..types import Verdict, VerifyInput
from .drafts import StepDraft, StepTokensDraft


def token_veto(x: VerifyInput, top_k: int | None = None, confidence: float = 1.0,
               floor: float = 0.0) -> dict[str, torch.BoolTensor]:
    """[B] steps to refuse because a token is implausible to the target, from the verification logits:
    ``veto_topk`` when a token is outside the target's top ``top_k``, ``veto_floor`` when a token has
    probability below ``floor`` where the target's top probability is at least ``confidence``."""
    p, tokens = x.target_probs[:, : x.k], x.draft.tokens
    out = {}
    if top_k:
        in_top = (p.topk(min(top_k, p.shape[-1]), dim=-1).indices == tokens[..., None]).any(-1)
        out["veto_topk"] = (~in_top).any(-1)
    if floor > 0:
        p_x = p.gather(-1, tokens[..., None]).squeeze(-1)
        out["veto_floor"] = ((p.max(-1).values >= confidence) & (p_x < floor)).any(-1)
    return out


class StepRule(BaseRule):
    """Accept a `StepDraft` whole when no veto fires and `judge` says so, then the target's
    own token follows; otherwise keep nothing and emit the target's token at the step's start (the
    step drafter then lets the target write that step). `StepTokensDraft` drafts go to
    ``token_rule`` (lossless speculative sampling by default).

    The veto (``veto_top_k``, ``veto_confidence``/``veto_floor``; see `token_veto`) is checked
    before the judge, so a vetoed step costs the judge nothing. Reasons: ``step`` (accepted step
    tokens), ``step_rejected``, and the veto that fired; scores: the judge's and ``step_accepted``.
    """

    preferred_drafter = "step"  # with assistant_model=, generate() drafts whole steps
    _coupling = "own-draft"  # a step is judged whole; coupled steps are drafted on noise of their own

    def __init__(self, token_rule: BaseRule | None = None, veto_top_k: int | None = None,
                 veto_confidence: float = 0.9, veto_floor: float = 0.0) -> None:
        if veto_top_k is not None and veto_top_k < 1:
            raise ValueError(f"veto_top_k must be >= 1 (or None for no top-k veto), got {veto_top_k}")
        if not 0.0 <= veto_confidence <= 1.0 or not 0.0 <= veto_floor <= 1.0:
            raise ValueError("veto_confidence and veto_floor are probabilities in [0, 1]")
        self.token_rule = token_rule or SpeculativeSampling()
        self.veto_top_k, self.veto_confidence, self.veto_floor = veto_top_k, float(veto_confidence), float(veto_floor)

    def judge(self, x: VerifyInput) -> tuple[torch.BoolTensor, dict[str, torch.Tensor]]:
        """[B] whether to accept each drafted step, and the per-step scores that decided it."""
        raise NotImplementedError

    def __call__(self, x: VerifyInput) -> Verdict:
        if x.k == 0 or isinstance(x.draft, StepTokensDraft):  # nothing drafted, or the target writes this step
            return self.token_rule(x)
        if not isinstance(x.draft, StepDraft):
            raise ValueError(f"{self.name} verifies whole steps drafted by a StepDrafter: pass assistant_model= "
                             "and tokenizer= (generate() drafts steps with it) or "
                             "drafter=StepDrafter(draft_model, StepSegmenter(tokenizer))")
        vetoes = token_veto(x, self.veto_top_k, self.veto_confidence, self.veto_floor)
        vetoed = torch.zeros(x.draft.tokens.shape[0], dtype=torch.bool, device=x.draft.tokens.device)
        for fired in vetoes.values():
            vetoed |= fired
        accept, scores = (~vetoed, {}) if bool(vetoed.all()) else self.judge(x)
        accept = accept & ~vetoed
        n = torch.where(accept, x.k, 0)
        first = prefix_mask(torch.ones_like(n), x.k)
        reasons = {"step": prefix_mask(n, x.k), "step_rejected": first & ~accept[:, None],
                   **{name: first & fired[:, None] for name, fired in vetoes.items()}}
        return Verdict(n, at_position(target_choices(x), n), reasons,
                       scores={**scores, "step_accepted": accept.float()})
