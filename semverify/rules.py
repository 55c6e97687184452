"""Acceptance rules: pure functions of tensors that decide how much of a draft to keep.

A token rule states its law (`TokenLaw`): at each drafted position, the probability of keeping each token had it
been drafted, and the law of the token it emits when it refuses. The engine draws from that law in every mode
(`semverify.engine.drawing.decide`: greedy, uncoupled, coupled), so a rule has no branch per mode and a coupled run
measures the rule itself. Rules whose decision looks past one position (a window, a whole step) implement
``__call__`` themselves. Rules read tensors only (SpecReason's ``extend`` asks the loop for one more target
forward), so they are tested on hand-built tensors.
"""

from __future__ import annotations

import warnings

import torch

from .engine.argmax import vocab_argmax
from .engine.drawing import at_position, decide, leading_true, prefix_mask  # noqa: F401  (rules build on them)
from .engine.noise import is_coupled, sample_from
from .engine.verification import sample_tree, verify_paths
from .types import TokenLaw, Verdict, VerifyInput


class BaseRule:
    """The rule contract, with defaults: a token rule subclasses this and implements `law`; a rule whose decision
    is not local to one position implements ``__call__`` (and sets `coupling`).

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
    _coupling: str | None = None  # a rule with its own __call__: "own-draft" if it may run coupled (`coupling`)

    def law(self, x: VerifyInput) -> TokenLaw:
        """The rule's law at each drafted position of the chain in ``x`` (see `TokenLaw`)."""
        raise NotImplementedError(f"{type(self).__name__} states no law: implement law(x) -> TokenLaw (or "
                                  "__call__(x) -> Verdict for a rule that looks past one position)")

    def __call__(self, x: VerifyInput) -> Verdict:
        """The verdict on the chain in ``x``: the engine draws from `law` in the mode of ``x``."""
        return decide(self, x)

    @property
    def states_law(self) -> bool:
        """Whether the engine draws for this rule from its `law` (no ``__call__`` of its own)."""
        return type(self).law is not BaseRule.law and type(self).__call__ is BaseRule.__call__

    @property
    def coupling(self) -> str | None:
        """How a coupled run draws for this rule: ``"law"``, the engine draws the Gumbel-max of its emitted law;
        ``"own-draft"``, the rule decides from the target's own coupled tokens (`target_choices`) and the draft
        draws from noise of its own (then every draw it compares is independent, as uncoupled); ``None``: it
        cannot run coupled (a rule with its own ``__call__`` that did not say which tokens it compares)."""
        return "law" if self.states_law else self._coupling

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


def __getattr__(name: str):
    """``AcceptanceRule``, the former name of `BaseRule`: deprecated, kept for one release (until 0.3)."""
    if name == "AcceptanceRule":
        warnings.warn("semverify.AcceptanceRule is deprecated and goes in 0.3; use semverify.BaseRule (a rule) or "
                      "semverify.types.Judge (what the engine sees of one)", DeprecationWarning, stacklevel=2)
        return BaseRule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_draft_length(rule: BaseRule, k: int) -> None:
    """Refuse drafts shorter than ``rule.min_k``: on them the rule is silently exact matching."""
    if k < rule.min_k:
        raise ValueError(f"rule {rule.name!r} needs drafts of at least {rule.min_k} tokens (its window), got k={k}: "
                         f"with shorter drafts it never departs from exact matching; use k >= {rule.min_k} or a "
                         "smaller window")


def target_choices(x: VerifyInput) -> torch.LongTensor:
    """The target's own token at each of the k+1 positions: argmax, or a draw when sampling (with coupled
    noise, the Gumbel-max of the warped logits at each position: the token the target alone would emit). For rules
    that decide by comparing drafts with these tokens themselves (``coupling = "own-draft"``)."""
    if is_coupled(x.generator):
        return x.generator.choose(x.target_logits, tokens=x.draft.tokens)
    if x.do_sample:
        return sample_from(x.target_probs, x.generator)
    return vocab_argmax(x.target_logits)


def token_probs(x: VerifyInput) -> torch.Tensor:
    """[B, k, V] p: the target's warped distribution at the drafted positions (T=1 under greedy decoding)."""
    return x.target_probs[:, : x.k]


def ratio(p: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """min(1, p/q) for every candidate (q=None: a deterministic draft, kept with probability p)."""
    if q is None:
        return p
    return torch.where(q > 0, p / q.clamp_min(torch.finfo(q.dtype).tiny), torch.ones_like(p)).clamp(max=1.0)


def one_hot_argmax(x: VerifyInput) -> torch.Tensor:
    """[B, k, V] 1.0 at the target's argmax of each drafted position (greedy keeps exactly that)."""
    logits = x.target_logits[:, : x.k]
    return torch.zeros_like(logits, dtype=torch.float).scatter_(-1, vocab_argmax(logits)[..., None], 1.0)


class GreedyMatch(BaseRule):
    """Keep the longest draft prefix equal to the target's own choices, then the target's next choice.

    Greedy: the choices are argmaxes, so output equals greedy target decoding. Sampling: the target
    draws its token at every position and the draft must match the draw ("sample and compare"): x is kept with
    probability p(x) and a refusal draws from p without x, which is lossless but accepts less than
    `SpeculativeSampling`.
    """

    name = "greedy"
    lossless = True

    def law(self, x: VerifyInput) -> TokenLaw:
        if not x.do_sample:
            return TokenLaw(one_hot_argmax(x))
        return TokenLaw(token_probs(x).float(), target=0.0, without=1.0)


class SpeculativeSampling(BaseRule):
    """Leviathan/Chen rejection sampling: accept x with prob min(1, p(x)/q(x)), else draw from (p-q)+.

    With no draft probabilities (a deterministic proposer) q is one-hot, so x is kept with prob p(x)
    and a rejection draws from p with x removed. Under greedy decoding this is `GreedyMatch`, and under coupled
    noise the engine keeps drafts while they equal the target's coupled token (its emitted law is p), which makes
    the output the target alone's whatever the drafter (trees too, path by path); the drafts then accept as often
    as the draft's noise agrees with the target's (`semverify.engine.coupling`).
    A sampled token tree is verified sibling by sibling with the same one-hot test
    (`verify_sampled_tree`); a subclass that changes the test must change that too.
    """

    name = "speculative"
    lossless = True

    def law(self, x: VerifyInput) -> TokenLaw:
        if not x.do_sample:
            return TokenLaw(one_hot_argmax(x))
        q = None if x.draft.probs is None else x.draft.probs[:, : x.k].float()
        return TokenLaw(ratio(token_probs(x).float(), q), target=0.0, residual=1.0)

    def verify_sampled_tree(self, x: VerifyInput) -> tuple[list[int], Verdict]:
        """Sibling by sibling, lossless (see `semverify.engine.verification.sample_tree`)."""
        return sample_tree(x)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dimension; zero-probability entries contribute 0."""
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(dim=-1)


class TypicalAcceptance(BaseRule):
    """Medusa's typical acceptance: keep x when p(x) > min(eps, delta * exp(-H(p))), or x is the argmax.

    Lossy: confident target positions demand high p(x), uncertain ones accept plausible tokens.
    Under greedy decoding its lossless limit is exact matching: ``posterior_threshold >= 1`` with
    ``posterior_alpha=float("inf")`` (the bound is then 1, which no p(x) exceeds); sampled, the argmax is still kept
    whatever the target draws, and a refusal draws from p (Medusa).
    """

    name = "typical"

    def __init__(self, posterior_threshold: float = 0.09, posterior_alpha: float = 0.3) -> None:
        if posterior_threshold < 0 or posterior_alpha < 0:
            raise ValueError("posterior_threshold and posterior_alpha must be >= 0")
        self.posterior_threshold = posterior_threshold
        self.posterior_alpha = posterior_alpha

    def law(self, x: VerifyInput) -> TokenLaw:
        """Keep the argmax and every token above the bound (surely); a refusal draws from p (Medusa)."""
        p = token_probs(x).float()
        bound = torch.clamp(self.posterior_alpha * torch.exp(-entropy(p)), max=self.posterior_threshold)
        keep = torch.maximum(one_hot_argmax(x), (p > bound[..., None]).float())
        return TokenLaw(keep, reason="typical")
