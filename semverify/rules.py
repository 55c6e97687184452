"""Acceptance rules: pure functions of tensors that decide how much of a draft to keep.

A rule maps a `VerifyInput` (draft tokens, draft q, target logits for the k+1 positions) to a
`Verdict` (accepted count and the one token that follows). Rules never touch a model, so they
are tested on hand-built tensors; the loop is the only place that runs models.
"""

from __future__ import annotations

import torch

from .engine.argmax import vocab_argmax
from .engine.coupling import is_coupled
from .engine.sampling import sample_from, uniform
from .engine.verification import sample_tree, verify_paths
from .types import Verdict, VerifyInput


class BaseRule:
    """The rule contract, with defaults: a rule subclasses this and implements ``__call__``.

    Flags: ``lossless`` (keeps the target's output distribution), ``needs_draft_probs`` (reads
    ``draft.probs``), ``needs_hidden_states`` (reads ``target_hidden``), ``needs_extend`` (asks the
    target more through ``VerifyInput.extend``, which the loop offers for one row); ``preferred_drafter`` is the
    drafter kind ``generate(assistant_model=...)`` builds for it; ``min_k`` is the shortest draft on which the
    rule can depart from exact matching at all (FLy's window needs drafts as long as itself): methods with a
    smaller k are refused. Optional abilities are methods:
    `verify_tree`, `verify_sampled_tree`, and `artifacts` (files the rule was built from).
    """

    name: str = "rule"
    lossless: bool = False
    needs_draft_probs: bool = False
    needs_hidden_states: bool = False
    needs_extend: bool = False
    preferred_drafter: str = "model"
    min_k: int = 1
    history_tokens: int = 0  # output tokens per row the rule reads from VerifyInput.history (the loop fills them)
    _sources: tuple[str, ...] = ()

    def __call__(self, x: VerifyInput) -> Verdict:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__(x: VerifyInput) -> Verdict")

    @property
    def artifacts(self) -> tuple[str, ...]:
        """The files this rule was built from (calibrations, probes): runs pin them by content."""
        return self._sources

    def built_from(self, *sources: str) -> "BaseRule":
        """Record the files this rule was built from (see `artifacts`); returns the rule."""
        self._sources = tuple(sources)
        return self

    def verify_tree(self, x: VerifyInput) -> tuple[list[int], Verdict]:
        """The accepted path and verdict of a tree draft. Greedy and coupled decoding judge it path by path
        (`verify_paths`), which is exact there; sampled trees go to
        `verify_sampled_tree`."""
        if x.do_sample and not is_coupled(x.generator):
            return self.verify_sampled_tree(x)
        return verify_paths(self, x)

    def verify_sampled_tree(self, x: VerifyInput) -> tuple[list[int], Verdict]:
        """A sampled (uncoupled) tree draft: refused unless the rule knows a lossless scheme for it."""
        raise NotImplementedError(f"rule {self.name!r} judges tree drafts path by path, which is exact for "
                                  "greedy decoding only; sample over trees with rule='speculative', or use "
                                  "do_sample=False or a chain drafter")


AcceptanceRule = BaseRule  # the former name of the contract, kept for type hints in user code


def check_draft_length(rule: BaseRule, k: int) -> None:
    """Refuse drafts shorter than ``rule.min_k``: on them the rule is silently exact matching."""
    if k < rule.min_k:
        raise ValueError(f"rule {rule.name!r} needs drafts of at least {rule.min_k} tokens (its window), got k={k}: "
                         f"with shorter drafts it never departs from exact matching; use k >= {rule.min_k} or a "
                         "smaller window")


def leading_true(mask: torch.Tensor) -> torch.LongTensor:
    """Length of the all-True prefix of each row of a [B, k] bool mask."""
    if mask.shape[-1] == 0:
        return torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    return mask.long().cumprod(dim=-1).sum(dim=-1)


def prefix_mask(n: torch.LongTensor, k: int) -> torch.BoolTensor:
    """[B, k] mask of the first n[b] positions of each row."""
    return torch.arange(k, device=n.device)[None, :] < n[:, None]


def at_position(t: torch.Tensor, pos: torch.LongTensor) -> torch.Tensor:
    """Row b of the result is t[b, pos[b]] (t is [B, n, ...])."""
    return t[torch.arange(t.shape[0], device=t.device), pos]


def target_choices(x: VerifyInput) -> torch.LongTensor:
    """The target's own token at each of the k+1 positions: argmax, or a draw when sampling (with coupled
    noise, the Gumbel-max of the warped logits at each position: the token the target alone would emit)."""
    if is_coupled(x.generator):
        return x.generator.choose(x.target_logits, tokens=x.draft.tokens)
    if x.do_sample:
        return sample_from(x.target_probs, x.generator)
    return vocab_argmax(x.target_logits)


class GreedyMatch(BaseRule):
    """Keep the longest draft prefix equal to the target's own choices, then the target's next choice.

    Greedy: the choices are argmaxes, so output equals greedy target decoding. Sampling: the target
    draws its token at every position and the draft must match the draw ("sample and compare"),
    which is lossless but accepts less than `SpeculativeSampling`.
    """

    name = "greedy"
    lossless = True

    def __call__(self, x: VerifyInput) -> Verdict:
        choice = target_choices(x)
        match = x.draft.tokens == choice[:, : x.k]
        n = leading_true(match)
        return Verdict(n, at_position(choice, n), {"exact": prefix_mask(n, x.k)})


class SpeculativeSampling(BaseRule):
    """Leviathan/Chen rejection sampling: accept x with prob min(1, p(x)/q(x)), else draw from (p-q)+.

    With no draft probabilities (a deterministic proposer) q is one-hot, so x is kept with prob p(x)
    and a rejection draws from p with x removed. Under greedy decoding this is `GreedyMatch`, and
    so it is under coupled noise (`semverify.engine.coupling`): drafts are kept while they equal the
    coupled target token, which makes the output the target alone's whatever the drafter (trees too,
    path by path), at the cost of accepting less than min(1, p/q) when the draft did not share the noise.
    A sampled token tree is verified sibling by sibling with the same one-hot test
    (`verify_sampled_tree`); a subclass that changes the test must change that too.
    """

    name = "speculative"
    lossless = True

    def __call__(self, x: VerifyInput) -> Verdict:
        if not x.do_sample or is_coupled(x.generator):
            return GreedyMatch()(x)
        n = leading_true(ratio_test(x))
        return Verdict(n, draw_after(x, n), {"ratio": prefix_mask(n, x.k)})

    def verify_sampled_tree(self, x: VerifyInput) -> tuple[list[int], Verdict]:
        """Sibling by sibling, lossless (see `semverify.engine.verification.sample_tree`)."""
        return sample_tree(x)


def ratio_test(x: VerifyInput) -> torch.BoolTensor:
    """[B, k] outcome of ``u < p(x)/q(x)`` at every draft position, one uniform u each (drawn here)."""
    tokens = x.draft.tokens
    p_x = x.target_probs[:, : x.k].gather(-1, tokens[..., None]).squeeze(-1)
    q = x.draft.probs
    q_x = q.gather(-1, tokens[..., None]).squeeze(-1) if q is not None else torch.ones_like(p_x)
    u = uniform(tuple(p_x.shape), x.generator, p_x.device)
    return u * q_x < p_x  # strict: u can be 0, and p(x)=0 must never pass


def residual(p_n: torch.Tensor, q_n: torch.Tensor | None, token: torch.LongTensor) -> torch.Tensor:
    """(p - q)+ at a rejected position; q=None means one-hot on the rejected ``token``."""
    if q_n is None:
        return p_n.scatter(-1, token[:, None], 0.0)
    return (p_n - q_n).clamp_min(0.0)


def draw_after(x: VerifyInput, n: torch.LongTensor) -> torch.LongTensor:
    """The token that follows n accepted drafts: a residual draw if n < k, else the bonus from p."""
    k = x.k
    p_n = at_position(x.target_probs, n)
    if k == 0:
        return sample_from(p_n, x.generator)
    rejected = n < k
    at = n.clamp(max=k - 1)
    q_n = at_position(x.draft.probs, at) if x.draft.probs is not None else None
    res = residual(p_n, q_n, at_position(x.draft.tokens, at))
    usable = rejected[:, None] & (res.sum(-1, keepdim=True) > 0)
    return sample_from(torch.where(usable, res, p_n), x.generator)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dimension; zero-probability entries contribute 0."""
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(dim=-1)


class TypicalAcceptance(BaseRule):
    """Medusa's typical acceptance: keep x when p(x) > min(eps, delta * exp(-H(p))), or x is the argmax.

    Lossy: confident target positions demand high p(x), uncertain ones accept plausible tokens.
    Its lossless limit is exact greedy matching: ``posterior_threshold >= 1`` with
    ``posterior_alpha=float("inf")`` (the bound is then 1, which no p(x) exceeds).
    """

    name = "typical"

    def __init__(self, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> None:
        if posterior_threshold < 0 or posterior_alpha < 0:
            raise ValueError("posterior_threshold and posterior_alpha must be >= 0")
        self.posterior_threshold = posterior_threshold
        self.posterior_alpha = posterior_alpha

    def __call__(self, x: VerifyInput) -> Verdict:
        tokens, k = x.draft.tokens, x.k
        p = x.target_probs[:, :k]
        choice = target_choices(x)
        # the token a draft must equal: the argmax (Medusa), or under coupled noise the target's own token
        top = choice[:, :k] if is_coupled(x.generator) else vocab_argmax(x.target_logits[:, :k])
        exact = tokens == top
        p_x = p.gather(-1, tokens[..., None]).squeeze(-1)
        bound = torch.clamp(self.posterior_alpha * torch.exp(-entropy(p)), max=self.posterior_threshold)
        n = leading_true(exact | (p_x > bound))
        kept = prefix_mask(n, k)
        return Verdict(n, at_position(choice, n), {"exact": kept & exact, "typical": kept & ~exact}, target_tokens=top)
