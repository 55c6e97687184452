"""SemanticSpec's step test: accept a drafted step when the target's probe says the target would write a
step of the same meaning about as often as the draft would (a ratio test on semantic probabilities)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..engine.noise import uniform
from ..rules import BaseRule
from ..types import VerifyInput
from .probe import ProbeError, SemanticProbe
from .steps import StepRule


class SemanticStepRule(StepRule):
    """For a drafted step: P_t = target_probe(mean target hidden over the step's tokens), P_d =
    draft_probe(the draft's pooled hidden), r = min(1, P_t / P_d); accept the whole step when
    r >= r_min and u < r (u uniform). Every judged step's P_t, P_d and unclipped P_t / P_d go to the
    statistics' ``scores``. The probes must be a pair labelled on the same steps (see
    `semverify.semanticspec.training`): otherwise their base rates differ and the ratio means nothing.

    ``r_min > 1`` never accepts a step, which leaves exact target decoding with a lossless token rule.
    """

    name = "semanticspec"
    needs_hidden_states = True

    def __init__(self, draft_probe: SemanticProbe, target_probe: SemanticProbe, r_min: float = 0.5,
                 token_rule: BaseRule | None = None, eps: float = 1e-6, **veto) -> None:
        super().__init__(token_rule, **veto)
        if r_min < 0:
            raise ValueError(f"r_min must be >= 0, got {r_min}")
        pairs = draft_probe.meta.get("pair"), target_probe.meta.get("pair")
        if pairs[0] is None or pairs[0] != pairs[1]:
            raise ProbeError(
                f"the draft probe ({draft_probe.source}) and the target probe ({target_probe.source}) were not "
                f"labelled on the same steps (pair ids {pairs[0]} and {pairs[1]}), so their base rates do not "
                "match and their ratio would not compare the models; train them together with `semverify probes`")
        self.draft_probe, self.target_probe = draft_probe.eval(), target_probe.eval()
        self.r_min, self.eps = float(r_min), eps

    @property
    def artifacts(self) -> tuple[str, ...]:
        """The probe files this rule reads (runs pin them by content)."""
        return tuple(p.source for p in (self.draft_probe, self.target_probe) if Path(p.source).is_file())

    def probabilities(self, x: VerifyInput) -> tuple[torch.Tensor, torch.Tensor]:
        """[B] P_t and P_d, the probes' semantic probabilities of a drafted step."""
        with torch.no_grad():
            p_t = self.target_probe(x.target_hidden[:, 1 : x.k + 1].float().mean(dim=1))
            p_d = self.draft_probe(x.draft.pooled_hidden.float())
        return p_t, p_d

    def judge(self, x: VerifyInput) -> tuple[torch.BoolTensor, dict[str, torch.Tensor]]:
        p_t, p_d = self.probabilities(x)
        raw = p_t / p_d.clamp_min(self.eps)
        r = raw.clamp(max=1.0)
        u = uniform(tuple(r.shape), x.generator, r.device)
        return (r >= self.r_min) & (u < r), {"p_target": p_t, "p_draft": p_d, "step_ratio": raw}
