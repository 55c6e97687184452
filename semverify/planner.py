"""The draft-length planner: each step, the number of draft tokens (0 = plain decoding) that maximises the
expected tokens per second, from this machine's forward costs and the acceptance measured so far.

With per-position acceptance a_j (the chance that draft token j is kept once token j-1 was), a step that drafts
k tokens emits E(k) = 1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens and costs k draft forwards plus one target
forward over k + 1 tokens. The planner picks the k in 0..k_max with the largest E(k) / cost(k), where costs are
in units of the target's one-token forward, so k = 0 (one token for one forward) is the bar every draft must
clear: on a machine where wide forwards cost nearly linearly it stops speculating. While it decodes plainly it
drafts a short probe now and then, at doubling intervals, so that it notices when acceptance rises; a probe
costs more than its draft (the draft model first catches up on every token since its last draft), so where
no draft could gain 10% even if 95% of draft tokens were kept it never probes. Any draft length is lossless
under a lossless rule; the planner only changes speed (Sequoia's hardware-aware shapes, vLLM's dynamic draft
length and TensorRT-LLM's acceptance threshold are the anchors).
"""

from __future__ import annotations

from .cost import PLAN_SIZES, cost_at, forward_costs

PRIOR = 0.6  # the acceptance assumed per draft position before any is observed


class DraftPlanner:
    """Chooses each step's draft length from ``verify_costs`` (target forward seconds per number of draft
    tokens, any unit) and ``draft_cost`` (one draft-model forward in the same unit).

    ``prior`` is the acceptance assumed before any step (worth ``prior_weight`` observed drafts per position;
    a later position's prior is the estimate of the one before it);
    after ``probe_every`` plain steps in a row it drafts ``probe`` tokens, and the interval doubles after each
    probe that does not bring drafting back (at most ``MAX_INTERVAL``).
    """

    OPTIMISTIC = 0.95  # the acceptance a probe could at best reveal
    MARGIN = 1.1  # the gain in tokens per cost that must be possible for probing to be worth its catch-up
    MAX_INTERVAL = 1024

    def __init__(self, verify_costs: dict[int, float], draft_cost: float, k_max: int, prior: float = PRIOR,
                 prior_weight: float = 4.0, probe_every: int = 16, probe: int = 2) -> None:
        if 0 not in verify_costs or verify_costs[0] <= 0:
            raise ValueError("verify_costs needs the cost of a one-token forward (0 draft tokens), above 0")
        if draft_cost < 0 or k_max < 0 or not 0.0 <= prior <= 1.0 or prior_weight <= 0 or probe_every < 1:
            raise ValueError("draft_cost, k_max >= 0, prior in [0, 1], prior_weight > 0 and probe_every >= 1")
        unit = verify_costs[0]
        self.verify = monotone({n: c / unit for n, c in verify_costs.items()})
        self.draft_cost, self.k_max = draft_cost / unit, k_max
        self.prior, self.prior_weight, self.probe_every, self.probe = prior, prior_weight, probe_every, probe
        self.tried = [0] * k_max  # drafts that reached position j (its predecessor was kept)
        self.kept = [0] * k_max  # of those, how many kept position j
        self.plain_steps, self.interval = 0, probe_every
        self.chosen: list[int] = []

    def acceptance(self) -> list[float]:
        """Each position's estimated chance of being kept once its predecessor was: its own counts shrunk
        towards the estimate of the position before it (the prior for the first). A position never drafted
        yet so takes what the last drafted one showed, not the prior: acceptance changes little with the
        position, and a planner that only ever drafted one token would otherwise never learn that more pay."""
        estimates, before = [], self.prior
        for tried, kept in zip(self.tried, self.kept):
            before = (kept + before * self.prior_weight) / (tried + self.prior_weight)
            estimates.append(before)
        return estimates

    def expected_tokens(self, k: int, acceptance: list[float] | None = None) -> float:
        """Tokens a step that drafts ``k`` tokens is expected to emit (the target's own token included), under
        ``acceptance`` (default: the estimate so far)."""
        total, reach = 1.0, 1.0
        for a in (self.acceptance() if acceptance is None else acceptance)[:k]:
            reach *= a
            total += reach
        return total

    def step_cost(self, k: int) -> float:
        """A step's cost in one-token target forwards: ``k`` draft forwards and the verification."""
        return k * self.draft_cost + cost_at(self.verify, k)

    def gain(self, k: int, acceptance: list[float] | None = None) -> float:
        """Expected tokens per unit of cost of drafting ``k`` (plain decoding: 1)."""
        return self.expected_tokens(k, acceptance) / self.step_cost(k)

    def best(self) -> int:
        """The draft length with the most expected tokens per unit of cost (the shortest among ties)."""
        acceptance = self.acceptance()
        return max(range(self.k_max + 1), key=lambda k: (self.gain(k, acceptance), -k))

    def could_pay(self) -> bool:
        """Could some draft gain ``MARGIN`` over plain decoding if ``OPTIMISTIC`` of its tokens were kept?"""
        hopeful = [self.OPTIMISTIC] * self.k_max
        return max(self.gain(k, hopeful) for k in range(self.k_max + 1)) >= self.MARGIN

    def choose(self) -> int:
        """This step's draft length: the best one, or a probe after ``interval`` plain steps in a row."""
        k = self.best()
        if k > 0:
            self.plain_steps, self.interval = 0, self.probe_every
        else:
            self.plain_steps += 1
            if self.plain_steps >= self.interval and self.k_max and self.could_pay():
                k, self.plain_steps = min(self.probe, self.k_max), 0
                self.interval = min(2 * self.interval, self.MAX_INTERVAL)
        self.chosen.append(k)
        return k

    def update(self, drafted: int, accepted: int) -> None:
        """Count a verified draft of ``drafted`` tokens of which the first ``accepted`` were kept."""
        for j in range(min(drafted, accepted + 1, self.k_max)):
            self.tried[j] += 1
            self.kept[j] += j < accepted


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """``costs`` made non-decreasing in the number of draft tokens (each the largest cost at that width or any
    narrower one): in steady state a wider forward never costs less, so a dip is measurement noise, and it
    would flatter the one width it fell on."""
    out, most = {}, 0.0
    for n in sorted(costs):
        most = max(most, costs[n])
        out[n] = most
    return out


def planner_for(target, draft, k_max: int, progress: bool = True) -> DraftPlanner:
    """A planner from the forward costs of ``target`` and ``draft`` on this machine (cached, else measured
    once now; see `semverify.cost.forward_costs`)."""
    verify = forward_costs(target, tuple(n for n in PLAN_SIZES if n <= max(k_max, 1)), progress=progress)
    drafting = forward_costs(draft, (0,), progress=progress)
    return DraftPlanner(verify, drafting[0], k_max)
