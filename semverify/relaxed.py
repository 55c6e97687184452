"""Relaxed acceptance as the serving engines ship it: SGLang's accept thresholds, TensorRT-LLM's relaxed top-k,
transformers' ensemble weight, and MARS's margin-aware verification (arXiv 2601.15498).

Each rule keeps the longest draft prefix that a per-position test accepts, where the test is the lossless one
(exact match with the target's own token under greedy decoding or coupled noise, the rejection test when
sampling) OR the engine's relaxation; after the prefix comes what the lossless rule would emit (the argmax, the
coupled target token, or a residual draw), except where the engine itself emits something else (said in the
class). Every rule has a setting at which it is `SpeculativeSampling` token for token (tested), and a method
preset on the draft model (k = 5). ``docs/methods/knobs.md`` maps each engine setting to these parameters.
"""

from __future__ import annotations

import math

import torch

from .engine.argmax import vocab_argmax
from .engine.coupling import is_coupled
from .engine.sampling import uniform
from .methods import Method, register_method
from .registry import register_rule
from .rules import (
    BaseRule,
    SpeculativeSampling,
    at_position,
    draw_after,
    leading_true,
    prefix_mask,
    ratio_test,
    target_choices,
)
from .types import Draft, Verdict, VerifyInput


def _number(name: str, value: float) -> float:
    """``value`` as a float, refusing text, booleans and NaN with an error naming the parameter."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _token_probs(x: VerifyInput) -> torch.Tensor:
    """[B, k] the target's probability of each draft token (its warped distribution; T=1 under greedy)."""
    return x.target_probs[:, : x.k].gather(-1, x.draft.tokens[..., None]).squeeze(-1)


def _aux_uniform(x: VerifyInput) -> torch.Tensor:
    """[B, k] uniforms from the rule's generator (coupled noise: its auxiliary stream, never the target's)."""
    return uniform((x.draft.tokens.shape[0], x.k), x.generator, x.target_logits.device)


def _relaxed_verdict(x: VerifyInput, relaxed: torch.BoolTensor, reason: str) -> Verdict:
    """Keep the prefix where the lossless test OR ``relaxed`` holds; the token after it is the lossless rule's.

    The lossless test is exact matching with the target's own token (argmax, or the coupled token) under greedy
    decoding and coupled noise, and Leviathan/Chen's ratio test when sampling; with ``relaxed`` all False the
    verdict is `SpeculativeSampling`'s, random draws included. ``target_tokens`` marks the kept tokens the
    lossless test would have refused (their "own" token: the target's choice, or its argmax when sampling).
    """
    tokens, k = x.draft.tokens, x.k
    if x.do_sample and not is_coupled(x.generator):
        strict, strict_reason = ratio_test(x), "ratio"
        n = leading_true(strict | relaxed)
        next_token, own = draw_after(x, n), vocab_argmax(x.target_logits[:, :k])
    else:
        choice = target_choices(x)
        own, strict_reason = choice[:, :k], "exact"
        strict = tokens == own
        n = leading_true(strict | relaxed)
        next_token = at_position(choice, n)
    kept = prefix_mask(n, k)
    return Verdict(n, next_token, {strict_reason: kept & strict, reason: kept & ~strict},
                   target_tokens=torch.where(strict, tokens, own))


class ThresholdAcceptance(BaseRule):
    """SGLang's ``--speculative-accept-threshold-single`` / ``--speculative-accept-threshold-acc``.

    SGLang verifies with target probabilities only (`TreeSpeculativeSamplingTargetOnly` in
    ``sgl-kernel/csrc/speculative/speculative_sampling.cuh``): at each depth of the draft tree, with one uniform
    coin per depth, a child x is accepted if ``coin <= prob_acc / threshold_acc`` or ``p(x) >= threshold_single``,
    where ``prob_acc`` sums the target probabilities of the siblings tried so far at that depth (reset on
    acceptance); a refused sibling's probability is removed from p, and after the last acceptance the next token is
    drawn from what is left of p (all of p after a full acceptance). The draft's own q is not used. Greedy requests
    never reach this kernel: SGLang verifies them by argmax matching and ignores both thresholds. On a chain every
    depth has one child, so ``prob_acc = p(x)``: keep x if ``u < p(x) / threshold_acc`` or ``p(x) >= threshold_single``
    (u: a uniform from the rule's generator; SGLang's ``<=`` differs only when u equals the bound exactly), and on
    a refusal draw from p without x. At 1.0/1.0 (SGLang's defaults) this is speculative sampling with a one-hot
    proposal, which keeps the target's distribution whatever q is, but it is not `SpeculativeSampling` with q: it
    accepts p(x) instead of min(1, p(x)/q(x)).

    Greedy decoding: exact matching, as SGLang (the thresholds are unused). Coupled noise: x is kept if it equals
    the coupled target token (probability p(x)), or if p(x) >= ``threshold_single``, or if an auxiliary-stream
    uniform falls below (min(1, p/threshold_acc) - p) / (1 - p): the chance of keeping x is then SGLang's
    min(1, p(x)/threshold_acc), and at ``threshold_acc=1`` only matching and the single threshold remain. Lossless
    limit: ``threshold_acc=1`` with ``threshold_single > 1`` (e.g. inf) is exactly `SpeculativeSampling` with a
    one-hot proposal when sampling, and exact matching under greedy decoding and coupled noise; SGLang's 1.0/1.0
    differs from it only where a target probability rounds to exactly 1.0 (then x is kept even in the rare case
    where the coupled draw is another token).
    """

    name = "threshold"

    def __init__(self, threshold_single: float = 1.0, threshold_acc: float = 1.0) -> None:
        self.threshold_single = _number("threshold_single", threshold_single)
        self.threshold_acc = _number("threshold_acc", threshold_acc)
        if self.threshold_single < 0:
            raise ValueError(f"threshold_single must be >= 0 (values above 1 switch it off), got {threshold_single}")
        if not 0.0 < self.threshold_acc <= 1.0:
            raise ValueError(f"threshold_acc must be in (0, 1] (1: the lossless coin), got {threshold_acc}")

    def __repr__(self) -> str:
        return f"ThresholdAcceptance(threshold_single={self.threshold_single}, threshold_acc={self.threshold_acc})"

    def __call__(self, x: VerifyInput) -> Verdict:
        tokens, k = x.draft.tokens, x.k
        coupled = is_coupled(x.generator)
        if not x.do_sample:
            verdict = SpeculativeSampling()(x)  # greedy: SGLang's argmax matching
            verdict.target_tokens = target_choices(x)[:, :k]
            return verdict
        p_x = _token_probs(x)
        u = _aux_uniform(x)
        single = p_x >= self.threshold_single
        if coupled:
            choice = target_choices(x)
            strict = tokens == choice[:, :k]
            extra = ((p_x / self.threshold_acc).clamp(max=1.0) - p_x).clamp(min=0.0)
            coin = u < torch.where(p_x < 1.0, extra / (1.0 - p_x).clamp(min=1e-12), torch.zeros_like(p_x))
            own, strict_reason = choice[:, :k], "exact"
        else:
            strict = u < p_x  # the lossless part of SGLang's coin
            coin = u < p_x / self.threshold_acc
            own, strict_reason = vocab_argmax(x.target_logits[:, :k]), "ratio"
        n = leading_true(strict | coin | single)
        if coupled:
            next_token = at_position(choice, n)
        else:  # target-only: a refused x leaves p without x (q is not used)
            next_token = draw_after(VerifyInput(Draft(tokens), x.target_logits, x.do_sample, generator=x.generator), n)
        kept = prefix_mask(n, k)
        acc = kept & ~strict & coin
        reasons = {strict_reason: kept & strict, "threshold_acc": acc, "threshold_single": kept & ~strict & ~acc}
        return Verdict(n, next_token, reasons, target_tokens=torch.where(strict, tokens, own))


class RelaxedTopK(BaseRule):
    """TensorRT-LLM's MTP relaxed acceptance: ``relaxed_topk`` and ``relaxed_delta``.

    TensorRT-LLM (``mtpRelaxedAcceptanceKernel`` in ``cpp/tensorrt_llm/kernels/speculativeDecoding/mtpKernels.cu``,
    fed by ``MTPWorker.sample_and_accept_draft_tokens`` in ``tensorrt_llm/_torch/speculative/mtp.py``) takes the
    target's top-``relaxed_topk`` tokens of softmax(logits) and keeps a draft token that is among them with a
    probability >= (top-1 probability - ``relaxed_delta``): an additive margin on probabilities, not on
    log-probabilities, despite the variable name ``gen_logprobs``; the token after the kept prefix is the top-1
    (greedy only). Its defaults, ``relaxed_topk=1`` and ``relaxed_delta=0``, are strict matching; it applies the
    rule only between ``begin_thinking_phase_token`` and ``end_thinking_phase_token`` (`semverify.phases`).
    ``space="log"`` measures the margin in log-probability instead (p(x) >= e^-delta p(top-1)), the form the vLLM
    requests ask for (top-3 and P(draft) >= 0.5 P(top-1): ``topk=3, delta=ln 2``).

    Here the relaxation applies where the target is undecided (a runner-up within the margin): any of its top-k
    tokens within the margin is then kept. Greedy decoding: that is TensorRT-LLM's rule exactly. Sampling and
    coupled noise, which TensorRT-LLM's relaxed path does not serve: the lossless test (ratio test, or the coupled
    token) OR that set. Probabilities are the warped distribution the target samples from, and a token of
    probability 0 is never kept. Lossless limit: ``topk=1`` (or ``delta=0``, up to exact ties with the top-1).
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

    def __repr__(self) -> str:
        return f"RelaxedTopK(topk={self.topk}, delta={self.delta:.4g}, space={self.space!r})"

    def relaxed(self, x: VerifyInput) -> torch.BoolTensor:
        """[B, k] draft tokens among the target's top-k within the margin, where a runner-up is within it too."""
        tokens, k = x.draft.tokens, x.k
        width = min(self.topk, x.target_logits.shape[-1])
        if width < 2 or k == 0:
            return torch.zeros_like(tokens, dtype=torch.bool)
        values, index = x.target_probs[:, :k].topk(width, dim=-1)
        top = values[..., :1]
        bar = top - self.delta if self.space == "prob" else top * math.exp(-self.delta)
        near = (values >= bar) & (values > 0)
        undecided = near[..., 1:].any(dim=-1)
        return undecided & ((index == tokens[..., None]) & near).any(dim=-1)

    def __call__(self, x: VerifyInput) -> Verdict:
        return _relaxed_verdict(x, self.relaxed(x), "topk")


class EnsembleVerification(BaseRule):
    """transformers' ``assistant_ensemble_weight`` w: verification against p' = w p + (1 - w) q (DIVERSED's static
    ensemble, arXiv 2604.07622).

    transformers (``_speculative_sampling`` in ``generation/utils.py``, 5.24) accepts x when u <= p'(x)/q(x) =
    1 - w + w p(x)/q(x), and after a refusal draws from (p - q)+ (the same distribution as (p' - q)+), falling back
    to p when that is numerically empty. Under greedy decoding it compares x with argmax(w p + (1 - w) q) at each
    draft position, and the token after the kept prefix is that argmax (the mixture's, not the target's) or the
    target's argmax after a full acceptance. It needs the draft's q, and w in (0, 1); None is lossless.

    Sampling: as transformers (u < ..., strict). Greedy decoding: as transformers. Coupled noise: x is kept if it
    equals the coupled target token, or an auxiliary-stream uniform falls below (1 - w)(1 - min(1, p/q)) / (1 - p),
    the probability w adds to standard speculative sampling's min(1, p/q) (so a token standard SD would keep for
    sure gains nothing); the coupled token follows. ``weight=1`` is `SpeculativeSampling` in every mode (its own
    code path); a weight below 1 also keeps tokens the target gives probability 0, as transformers does.
    """

    name = "ensemble"

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = _number("weight", weight)
        if not 0.0 < self.weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1] (1: lossless speculative sampling), got {weight}")
        self.needs_draft_probs = self.weight < 1.0

    def __repr__(self) -> str:
        return f"EnsembleVerification(weight={self.weight})"

    def __call__(self, x: VerifyInput) -> Verdict:
        if self.weight == 1.0:
            return SpeculativeSampling()(x)
        tokens, k, w, q = x.draft.tokens, x.k, self.weight, x.draft.probs
        if q is None:
            if k:
                raise ValueError("the ensemble rule with weight < 1 needs the draft distribution q (as transformers "
                                 "does); use a model drafter, not prompt lookup or retrieval")
            q = torch.zeros_like(x.target_logits[:, :0])
        p = x.target_probs[:, :k]
        choice = target_choices(x)
        if not x.do_sample:  # transformers: match argmax of the mixture; its argmax follows a refusal
            mixed = vocab_argmax(w * p + (1.0 - w) * q)
            n = leading_true(tokens == mixed)
            next_token = at_position(torch.cat([mixed, choice[:, k:]], dim=1), n)
            return self._verdict(x, n, next_token, tokens == choice[:, :k], "exact", choice[:, :k])
        p_x = _token_probs(x)
        q_x = q.gather(-1, tokens[..., None]).squeeze(-1)
        u = _aux_uniform(x)
        if is_coupled(x.generator):
            exact = tokens == choice[:, :k]
            ratio = torch.where(q_x > 0, p_x / q_x.clamp(min=1e-30), torch.ones_like(p_x)).clamp(max=1.0)
            extra = (1.0 - w) * (1.0 - ratio)
            coin = u < torch.where(p_x < 1.0, extra / (1.0 - p_x).clamp(min=1e-12), torch.zeros_like(p_x))
            n = leading_true(exact | coin)
            return self._verdict(x, n, at_position(choice, n), exact, "exact", choice[:, :k])
        strict = u * q_x < p_x  # standard speculative sampling with the same uniform
        n = leading_true(u * q_x < w * p_x + (1.0 - w) * q_x)
        own = vocab_argmax(x.target_logits[:, :k])
        return self._verdict(x, n, draw_after(x, n), strict, "ratio", own)

    @staticmethod
    def _verdict(x: VerifyInput, n: torch.LongTensor, next_token: torch.LongTensor, strict: torch.BoolTensor,
                 strict_reason: str, own: torch.LongTensor) -> Verdict:
        kept = prefix_mask(n, x.k)
        return Verdict(n, next_token, {strict_reason: kept & strict, "ensemble": kept & ~strict},
                       target_tokens=torch.where(strict, x.draft.tokens, own))


class MarginAwareVerification(BaseRule):
    """MARS (Song et al., "MARS: Unleashing the Power of Speculative Decoding via Margin-Aware Verification",
    arXiv 2601.15498): keep the target's runner-up where its own margin is small.

    As the paper states it for greedy verification: x is kept if it is the target's top-1 token, or its top-2
    token while the logit ratio z(2)/z(1) > ``theta`` (0.9 in the paper): the target is "undecided" and a
    rejection would gain little. Ambiguities and the choices made: (1) the ratio is of logits, not probabilities,
    so it assumes a positive top logit; with z(1) <= 0 the ratio means nothing and no relaxation applies here;
    (2) the logits are the ones the target samples from (raw under greedy decoding; the ratio does not change with
    temperature); (3) for sampling the paper gives no separate rule: here the lossless test (ratio test, or the
    coupled token) OR "the target is undecided and x is its top-1 or top-2", and the token after the prefix is
    the lossless rule's. Lossless limit: ``theta=1`` (z(2) never exceeds z(1)).
    """

    name = "mars"

    def __init__(self, theta: float = 0.9) -> None:
        self.theta = _number("theta", theta)
        if not 0.0 <= self.theta <= 1.0:
            raise ValueError(f"theta must be in [0, 1] (1: strict verification), got {theta}")

    def __repr__(self) -> str:
        return f"MarginAwareVerification(theta={self.theta})"

    def relaxed(self, x: VerifyInput) -> torch.BoolTensor:
        """[B, k] draft tokens that are the target's top-1 or top-2 where z(2) > theta z(1) > 0."""
        tokens, k = x.draft.tokens, x.k
        if x.target_logits.shape[-1] < 2 or k == 0:
            return torch.zeros_like(tokens, dtype=torch.bool)
        values, index = x.target_logits[:, :k].float().topk(2, dim=-1)
        z1, z2 = values[..., 0], values[..., 1]
        undecided = (z1 > 0) & (z2 > self.theta * z1)
        return undecided & (index == tokens[..., None]).any(dim=-1)

    def __call__(self, x: VerifyInput) -> Verdict:
        return _relaxed_verdict(x, self.relaxed(x), "margin")


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
    # TensorRT-LLM's published DeepSeek-R1 setting (top-10, delta 0.6 on probabilities), here without a phase
    Method("relaxed_topk_trt", "model", "relaxed_topk", {"topk": 10, "delta": 0.6}),
    # the weight transformers' own tests run the ensemble verifier with
    Method("ensemble", "model", "ensemble", {"weight": 0.7}),
    # the paper's theta
    Method("mars", "model", "mars", {"theta": 0.9}),
):
    register_method(_preset)

__all__ = ["EnsembleVerification", "MarginAwareVerification", "RelaxedTopK", "ThresholdAcceptance"]
