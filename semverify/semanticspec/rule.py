"""SemanticSpec's step test: accept a drafted step when the target's probe says the target would write a
step of the same meaning about as often as the draft would (a ratio test on semantic probabilities)."""

from __future__ import annotations

import torch

from ..rules import AcceptanceRule, SpeculativeSampling, at_position, prefix_mask, target_choices
from ..types import Verdict, VerifyInput
from .drafter import StepDrafter
from .probe import SemanticProbe
from .segment import StepSegmenter


class SemanticStepRule:
    """For a ``"step"`` draft: P_t = target_probe(mean target hidden over the step's tokens), P_d =
    draft_probe(meta["pooled_hidden"]), r = min(1, P_t / P_d); accept the whole step when r >= r_min
    and u < r (u uniform), then the target's token follows; otherwise keep nothing and emit the target's
    token at the step's start. Token drafts go to ``token_rule`` (lossless by default). Every judged
    step's P_t, P_d and unclipped P_t / P_d go to the statistics' ``scores``.

    ``r_min > 1`` never accepts a step, which leaves exact target decoding with a lossless token rule.
    """

    name = "semanticspec"
    lossless = False
    needs_draft_probs = False
    needs_hidden_states = True

    def __init__(self, draft_probe: SemanticProbe, target_probe: SemanticProbe, r_min: float = 0.5,
                 token_rule: AcceptanceRule | None = None, eps: float = 1e-6) -> None:
        if r_min < 0:
            raise ValueError(f"r_min must be >= 0, got {r_min}")
        self.draft_probe, self.target_probe = draft_probe.eval(), target_probe.eval()
        self.r_min, self.eps = float(r_min), eps
        self.token_rule = token_rule or SpeculativeSampling()

    def make_drafter(self, draft_model, tokenizer, max_step_tokens: int = 128) -> tuple[StepDrafter, int]:
        """What ``generate(..., assistant_model=m, acceptance=<this rule>)`` drafts with: whole steps of
        ``m`` (cut by text, so the tokenizer is needed), and the step cap as the draft length."""
        if tokenizer is None:
            raise ValueError("semanticspec cuts steps at text breaks: pass tokenizer= to generate()")
        return StepDrafter(draft_model, StepSegmenter(tokenizer, max_step_tokens=max_step_tokens)), max_step_tokens

    def probabilities(self, x: VerifyInput) -> tuple[torch.Tensor, torch.Tensor]:
        """[B] P_t and P_d, the probes' semantic probabilities of a drafted step."""
        with torch.no_grad():
            p_t = self.target_probe(x.target_hidden[:, 1 : x.k + 1].float().mean(dim=1))
            p_d = self.draft_probe(x.draft.meta["pooled_hidden"].float())
        return p_t, p_d

    def __call__(self, x: VerifyInput) -> Verdict:
        kind = x.draft.meta.get("kind")
        if kind == "tokens" or x.k == 0:
            return self.token_rule(x)
        if kind != "step" or x.target_hidden is None:
            raise ValueError("semanticspec verifies whole steps drafted by a StepDrafter: pass assistant_model= "
                             "(generate() wraps it) or drafter=StepDrafter(draft_model, StepSegmenter(tokenizer))")
        p_t, p_d = self.probabilities(x)
        raw = p_t / p_d.clamp_min(self.eps)
        r = raw.clamp(max=1.0)
        u = torch.rand(r.shape, generator=x.generator, device=r.device)
        accept = (r >= self.r_min) & (u < r)
        n = torch.where(accept, x.k, 0)
        choice = target_choices(x)
        first = prefix_mask(torch.ones_like(n), x.k)
        return Verdict(n, at_position(choice, n), {"step": prefix_mask(n, x.k),
                                                   "step_rejected": first & ~accept[:, None]},
                       scores={"p_target": p_t, "p_draft": p_d, "step_ratio": raw,
                               "step_accepted": accept.float()})
