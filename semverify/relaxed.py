"""Relaxed acceptance as the serving engines ship it: SGLang's accept thresholds, TensorRT-LLM's relaxed top-k,
transformers' ensemble weight, and MARS's margin-aware verification (arXiv 2601.15498).

Each rule states its law at every drafted position (`semverify.types.TokenLaw`): the probability of keeping each
token and the law of the token a refusal emits, as the engine's or authors' code does it (said in each class, with
the source line), and the engine draws from it in every mode. Every rule but MARS has a setting at which it is
lossless (tested), and a method preset on the draft model (k = 5). ``docs/methods/knobs.md`` maps each engine
setting to these parameters.
"""

from __future__ import annotations

import math

import torch

from .engine.argmax import vocab_argmax
from .methods import Method, register_method
from .registry import register_rule
from .rules import BaseRule, SpeculativeSampling, one_hot_argmax, ratio, token_probs
from .types import TokenLaw, VerifyInput


def _number(name: str, value: float) -> float:
    """``value`` as a float, refusing text, booleans and NaN with an error naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _draft_q(x: VerifyInput) -> torch.Tensor | None:
    """[B, k, V] the draft's q, or None for a deterministic drafter (then kept with probability p, as lossless)."""
    return None if x.draft.probs is None else x.draft.probs[:, : x.k].float()


def _labels(x: VerifyInput, **masks: torch.Tensor) -> dict[str, torch.BoolTensor]:
    """[B, k] masks over candidates ([B, k, V]) read at the drafted tokens."""
    return {name: mask.gather(-1, x.draft.tokens[..., None]).squeeze(-1).bool() for name, mask in masks.items()}


class ThresholdAcceptance(BaseRule):
    """SGLang's ``--speculative-accept-threshold-single`` / ``--speculative-accept-threshold-acc``.

    SGLang verifies with target probabilities only (`TreeSpeculativeSamplingTargetOnly` in
    ``sgl-kernel/csrc/speculative/speculative_sampling.cuh``): at each depth of the draft tree, with one uniform
    coin per depth, a child x is accepted if ``coin <= prob_acc / threshold_acc`` or ``p(x) >= threshold_single``,
    where ``prob_acc`` sums the target probabilities of the siblings tried so far at that depth (reset on
    acceptance); a refused sibling's probability is removed from p, and after the last acceptance the next token is
    drawn from what is left of p (all of p after a full acceptance). The draft's own q is not used. Greedy requests
    never reach this kernel: SGLang verifies them by argmax matching and ignores both thresholds.

    On a chain every depth has one child, so ``prob_acc = p(x)``. The law: x is kept with probability
    a(x) = min(1, p(x) / threshold_acc), or surely if p(x) >= threshold_single; a refusal draws from p without x
    (SGLang's ``<=`` against the engine's ``<`` differs only when the coin equals the bound exactly). Greedy: exact
    matching, as SGLang. Lossless exactly when ``threshold_acc = 1`` and ``threshold_single >= 1`` (SGLang's
    defaults): a(x) is then p(x), speculative sampling with a one-hot proposal.
    """

    name = "threshold"

    def __init__(self, threshold_single: float = 1.0, threshold_acc: float = 1.0) -> None:
        self.threshold_single = _number("threshold_single", threshold_single)
        self.threshold_acc = _number("threshold_acc", threshold_acc)
        if self.threshold_single < 0:
            raise ValueError(f"threshold_single must be >= 0 (values above 1 switch it off), got {threshold_single}")
        if not 0.0 < self.threshold_acc <= 1.0:
            raise ValueError(f"threshold_acc must be in (0, 1] (1: the lossless coin), got {threshold_acc}")
        self.lossless = self.threshold_acc == 1.0 and self.threshold_single >= 1.0

    def __repr__(self) -> str:
        return f"ThresholdAcceptance(threshold_single={self.threshold_single}, threshold_acc={self.threshold_acc})"

    def law(self, x: VerifyInput) -> TokenLaw:
        if not x.do_sample:  # SGLang's argmax matching
            return TokenLaw(one_hot_argmax(x), reason="threshold_acc")
        p = token_probs(x)
        single = p >= self.threshold_single
        keep = torch.where(single, 1.0, (p / self.threshold_acc).clamp(max=1.0))
        return TokenLaw(keep, target=0.0, without=1.0, reason="threshold_acc",
                        labels=_labels(x, threshold_single=single))


class RelaxedTopK(BaseRule):
    """TensorRT-LLM's MTP relaxed acceptance: ``relaxed_topk`` and ``relaxed_delta``.

    TensorRT-LLM (``mtpRelaxedAcceptanceKernel`` in ``cpp/tensorrt_llm/kernels/speculativeDecoding/mtpKernels.cu``,
    fed by ``MTPWorker.sample_and_accept_draft_tokens`` in ``tensorrt_llm/_torch/speculative/mtp.py``) takes the
    target's top-``relaxed_topk`` tokens of softmax(logits) and keeps a draft token that is among them with a
    probability >= (top-1 probability - ``relaxed_delta``): an additive margin on probabilities, not on
    log-probabilities, despite the variable name ``gen_logprobs``; the token after the kept prefix is the top-k's
    first entry (here the first-index argmax: the two differ only on exact ties). It serves greedy requests only.
    Its defaults, ``relaxed_topk=1`` and ``relaxed_delta=0``, are strict matching;
    ``use_relaxed_acceptance_for_thinking`` applies it only while thinking (`semverify.phases`). ``space="log"``
    measures the margin in log-probability instead (p(x) >= e^-delta p(top-1)), the form the vLLM requests ask for
    (top-3 and P(draft) >= 0.5 P(top-1):
    ``topk=3, delta=ln 2``).

    Greedy decoding: TensorRT-LLM's rule. Sampling, which TensorRT-LLM's relaxed path does not serve: a token in
    that set is kept surely, any other by the ratio test min(1, p/q), and a refusal draws from (p - q)+.
    Probabilities are the warped distribution the target samples from, and a token of probability 0 is never in the
    set; the set counts only where a runner-up is within the margin. Lossless limit: ``topk=1``, or ``delta=0`` up
    to exact ties.
    """

    name = "relaxed_topk"
    SPACES = ("prob", "log")

    def __init__(self, topk: int = 1, delta: float = 0.0, space: str = "prob") -> None:
        if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
            raise ValueError(f"topk must be an integer >= 1 (1: strict matching), got {topk!r}")
        self.topk, self.delta = topk, _number("delta", delta)
        if self.delta < 0:
            raise ValueError(f"delta must be >= 0 (0: strict up to exact ties), got {delta}")
        if space not in self.SPACES:
            raise ValueError(f"space must be one of {self.SPACES} ('prob': TensorRT-LLM's margin), got {space!r}")
        self.space = space
        self.lossless = topk == 1 or self.delta == 0  # (delta 0 up to exact ties with the top-1)

    def __repr__(self) -> str:
        return f"RelaxedTopK(topk={self.topk}, delta={self.delta:.4g}, space={self.space!r})"

    def relaxed(self, x: VerifyInput) -> torch.Tensor:
        """[B, k, V] 1.0 at the target's top-k tokens within the margin of its top-1, where a runner-up is within it
        (elsewhere the set is the top-1 alone, which the lossless test already judges)."""
        p = token_probs(x)
        values, index = p.topk(min(self.topk, p.shape[-1]), dim=-1)
        top = values[..., :1]
        bar = top - self.delta if self.space == "prob" else top * math.exp(-self.delta)
        near = (values >= bar) & (values > 0)
        near = near & (near.sum(-1, keepdim=True) > 1)
        return torch.zeros_like(p).scatter_(-1, index, near.float())

    def law(self, x: VerifyInput) -> TokenLaw:
        relaxed = self.relaxed(x)
        if not x.do_sample:
            return TokenLaw(torch.maximum(one_hot_argmax(x), relaxed), reason="topk")
        keep = torch.maximum(relaxed, ratio(token_probs(x), _draft_q(x)))
        return TokenLaw(keep, target=0.0, residual=1.0, reason="topk")


class EnsembleVerification(BaseRule):
    """transformers' ``assistant_ensemble_weight`` w: verification against p' = w p + (1 - w) q (DIVERSED's static
    ensemble, arXiv 2604.07622).

    transformers (``_speculative_sampling`` in ``generation/utils.py``, 5.24) accepts x when u <= p'(x)/q(x) =
    1 - w + w p(x)/q(x), and after a refusal draws from (p - q)+ (the same distribution as (p' - q)+), falling back
    to p when that is numerically empty: its emitted law is p' itself. Under greedy decoding it compares x with
    argmax(w p + (1 - w) q) at each draft position, and the token after the kept prefix is that argmax (the
    mixture's, not the target's) or the target's argmax after a full acceptance. It needs the draft's q, and w in
    (0, 1]; w = 1 (transformers' None) is lossless. A weight below 1 also keeps tokens the target gives probability 0,
    as transformers does.
    """

    name = "ensemble"

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = _number("weight", weight)
        if not 0.0 < self.weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1] (1: lossless speculative sampling), got {weight}")
        self.needs_draft_probs = self.weight < 1.0
        self.lossless = self.weight == 1.0

    def __repr__(self) -> str:
        return f"EnsembleVerification(weight={self.weight})"

    def law(self, x: VerifyInput) -> TokenLaw:
        if self.lossless:
            return SpeculativeSampling().law(x)
        q = _draft_q(x)
        if q is None:
            raise ValueError("the ensemble rule with weight < 1 needs the draft distribution q (as transformers "
                             "does); use a model drafter, not prompt lookup or retrieval")
        w, p = self.weight, token_probs(x)
        if not x.do_sample:  # transformers: match the mixture's argmax, which follows a refusal
            mixed = vocab_argmax(w * p + (1.0 - w) * q)
            return TokenLaw(torch.zeros_like(p).scatter_(-1, mixed[..., None], 1.0), target=w, draft=1.0 - w,
                            reason="ensemble")
        keep = torch.where(q > 0, 1.0 - w + w * p / q.clamp_min(torch.finfo(q.dtype).tiny), 1.0).clamp(max=1.0)
        return TokenLaw(keep, target=0.0, residual=1.0, reason="ensemble")


class MarginAwareVerification(BaseRule):
    """MARS (Song et al., "MARS: Unleashing the Power of Speculative Decoding via Margin-Aware Verification",
    arXiv 2601.15498) as the authors' code does it (``evaluate_posterior`` in ``mars/model/utils.py`` of their
    release, built on EAGLE-3).

    Greedy decoding: plain argmax matching (their code relaxes nothing there). Sampling: at each position, with z(1)
    and z(2) the two largest logits the target samples from (after the temperature, which the ratio does not see),
    the target is undecided when z(2) / (z(1) + 1e-10) > ``theta``; a negative top logit makes the ratio at least 1,
    so it relaxes there too, as theirs does. Undecided: x is kept if it is the top-1 or top-2 token (no coin, q
    unused), else refused, and the next token is drawn from the whole of p. Decided: the ratio test min(1, p/q), and
    on a refusal their code lowers only p(x) to max(0, p(x) - q(x)) = 0 and renormalises: p without x, not
    (p - q)+. So, sampled, the rule departs from the target's law even where it never relaxes, and it has no
    lossless setting; under greedy decoding it is exact matching. Default theta 0.9 (theirs).
    """

    name = "mars"

    def __init__(self, theta: float = 0.9) -> None:
        self.theta = _number("theta", theta)

    def __repr__(self) -> str:
        return f"MarginAwareVerification(theta={self.theta})"

    def undecided(self, x: VerifyInput) -> torch.BoolTensor:
        """[B, k] positions where z(2) / (z(1) + 1e-10) > theta (MARS's relaxation applies)."""
        logits = x.target_logits[:, : x.k].float()
        if logits.shape[-1] < 2:
            return torch.zeros(logits.shape[:-1], dtype=torch.bool, device=logits.device)
        z = logits.topk(2, dim=-1).values
        return z[..., 1] / (z[..., 0] + 1e-10) > self.theta

    def law(self, x: VerifyInput) -> TokenLaw:
        if not x.do_sample:
            return TokenLaw(one_hot_argmax(x), reason="margin")
        p, logits = token_probs(x), x.target_logits[:, : x.k].float()
        top2 = torch.zeros_like(p).scatter_(-1, logits.topk(min(2, p.shape[-1]), dim=-1).indices, 1.0)
        undecided = self.undecided(x)[..., None]
        keep = torch.where(undecided, top2, ratio(p, _draft_q(x)))
        return TokenLaw(keep, target=undecided.float(), without=(~undecided).float(), reason="margin")


# -- registration and method presets (the draft model drafts k = 5, as `sd`) -------------------------------------

register_rule("threshold", ThresholdAcceptance)
register_rule("relaxed_topk", RelaxedTopK)
register_rule("ensemble", EnsembleVerification)
register_rule("mars", MarginAwareVerification)
for _preset in (
    # SGLang users' setting with a separate small draft model (STANDALONE, Llama-3.2-1B drafting): 0.5 / 0.5
    Method("threshold", "model", "threshold", {"threshold_single": 0.5, "threshold_acc": 0.5}),
    # what the vLLM requests ask for: the target's top-3 with P(draft) >= 0.5 P(top-1)
    Method("relaxed_topk", "model", "relaxed_topk", {"topk": 3, "delta": math.log(2), "space": "log"}),
    # TensorRT-LLM's published DeepSeek-R1 setting (top-10, delta 0.6 on probabilities, relaxed while thinking): the
    # phase open from the output's start (R1's chat template opens <think> in the prompt, whose begin marker
    # TensorRT-LLM counts) until </think>, read once per step as TensorRT-LLM switches after a verification step
    Method("relaxed_topk_trt", "model", "relaxed_topk",
           {"topk": 10, "delta": 0.6, "phase_end": "</think>", "phase_switch": "step"}),
    # the same setting over the whole output (a model that does not think, as the default pair)
    Method("relaxed_topk_trt_whole", "model", "relaxed_topk", {"topk": 10, "delta": 0.6}),
    # the weight transformers' own tests run the ensemble verifier with
    Method("ensemble", "model", "ensemble", {"weight": 0.7}),
    # the paper's theta
    Method("mars", "model", "mars", {"theta": 0.9}),
):
    register_method(_preset)

__all__ = ["EnsembleVerification", "MarginAwareVerification", "RelaxedTopK", "ThresholdAcceptance"]
