"""``dtype="fastest"``: per role, the dtype that decodes fastest on this machine, read from its forward-cost
curves (`semverify.cost`; measured once per machine and cached).

A draft model's use is one one-token forward per draft token, so its time per token is that forward's cost. A
target's use is a verification whose width the planner picks, so its time per token is the best cost(k) / E(k)
over draft lengths k under the planner's prior acceptance (k = 0 is plain decoding). On a 2-core AVX2 EPYC
bfloat16 wins for both roles at batch 1; on a GPU bfloat16 or float16. This is not transformers'
``dtype="auto"``, which means the checkpoint's own dtype and keeps that meaning in `semverify.load_model`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .cost import PLAN_SIZES, cost_at, forward_costs
from .planner import PRIOR

ROLES = ("target", "draft")
CANDIDATES = {"cpu": (torch.float32, torch.bfloat16), "cuda": (torch.bfloat16, torch.float16, torch.float32),
              "mps": (torch.float16, torch.float32)}


def candidates(device: str | torch.device) -> tuple[torch.dtype, ...]:
    """The dtypes ``dtype="fastest"`` measures on ``device`` (float32 alone on devices it does not know)."""
    return CANDIDATES.get(torch.device(device).type, (torch.float32,))


def check_role(role: str) -> str:
    """``role`` if it is one of `ROLES`, else a ValueError."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return role


def role_sizes(role: str) -> tuple[int, ...]:
    """The draft sizes a role's time per token needs: the planner's for a target, the one-token forward for a draft."""
    return PLAN_SIZES if check_role(role) == "target" else (0,)


def seconds_per_token(costs: dict[int, float], role: str, prior: float = PRIOR) -> float:
    """Expected seconds per emitted token of a model with forward costs ``costs`` in ``role``."""
    if check_role(role) == "draft":
        return costs[0]
    return min(cost_at(costs, k) / sum(prior**j for j in range(k + 1)) for k in costs)


@dataclass(frozen=True)
class DtypeChoice:
    """What ``dtype="fastest"`` picked for a role and why: each candidate's expected seconds per token."""

    role: str
    dtype: torch.dtype
    seconds_per_token: dict[str, float]
    measured: tuple[str, ...] = ()  # the candidates measured for this choice (the others were cached)

    def to_dict(self) -> dict:
        return {"role": self.role, "dtype": str(self.dtype), "seconds_per_token": self.seconds_per_token,
                "measured": list(self.measured)}

    def summary(self) -> str:
        """One line, e.g. ``target: torch.bfloat16 (0.255 s/token; torch.float32 0.456)``."""
        own = str(self.dtype)
        others = "; ".join(f"{d} {s:.3f}" for d, s in self.seconds_per_token.items() if d != own)
        return f"{self.role}: {own} ({self.seconds_per_token[own]:.3f} s/token{'; ' + others if others else ''})"


def pick(curves: dict[torch.dtype, dict[int, float]], role: str, measured: tuple[torch.dtype, ...] = ()) -> DtypeChoice:
    """The candidate whose curve gives the fewest expected seconds per token in ``role``."""
    per = {dtype: seconds_per_token(costs, role) for dtype, costs in curves.items()}
    best = min(per, key=per.get)
    return DtypeChoice(role, best, {str(d): s for d, s in per.items()}, tuple(str(d) for d in measured))


def measure_curves(model: PreTrainedModel, dtypes: tuple[torch.dtype, ...], role: str,
                   progress: bool = True) -> dict[torch.dtype, dict[int, float]]:
    """Measure (and cache) ``model``'s curve in each of ``dtypes`` for ``role``. The model is converted in place,
    dtype after dtype: only its speed is measured, so it is meant to be discarded afterwards."""
    return {dtype: forward_costs(model.to(dtype), role_sizes(role), progress=progress) for dtype in dtypes}
