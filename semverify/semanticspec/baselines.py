"""Two step-level baselines on SemanticSpec's step drafter: the target's own likelihood of the step
(free from the verification pass) and SpecReason's judge (the target scores the step 0-9)."""

from __future__ import annotations

import math

import torch

from ..rules import BaseRule
from ..types import VerifyInput
from .steps import StepRule


class StepLikelihood(StepRule):
    """Accept a step when the target finds it likely: the mean log-probability of its tokens under the
    target's (warped) distribution is at least ``min_mean_logprob`` and no token is below
    ``min_token_prob``. Both come from the verification logits, so judging costs nothing.

    ``min_mean_logprob > 0`` (or ``min_token_prob > 1``) rejects every step: exact target decoding.
    """

    name = "step_likelihood"

    def __init__(self, min_mean_logprob: float = -math.inf, min_token_prob: float = 0.0,
                 token_rule: BaseRule | None = None, **veto) -> None:
        super().__init__(token_rule, **veto)
        if math.isnan(min_mean_logprob) or min_token_prob < 0:
            raise ValueError("min_mean_logprob must be a number and min_token_prob >= 0")
        self.min_mean_logprob, self.min_token_prob = float(min_mean_logprob), float(min_token_prob)

    def judge(self, x: VerifyInput) -> tuple[torch.BoolTensor, dict[str, torch.Tensor]]:
        p_x = x.target_probs[:, : x.k].gather(-1, x.draft.tokens[..., None]).squeeze(-1)
        logp = p_x.clamp_min(1e-30).log()
        mean, low = logp.mean(-1), p_x.min(-1).values
        return (mean >= self.min_mean_logprob) & (low >= self.min_token_prob), {"step_mean_logprob": mean,
                                                                                 "step_min_prob": low}


# SpecReason's judging turn (Pan et al. 2025): the question about the step, and the answer's opening
INSTRUCTION = ("Evaluate the last reasoning step solely based on factual correctness and logical validity. Ignore "
               "style, phrasing, or overall usefulness—only judge whether the step is objectively correct and "
               "logically follows from prior steps. Assign a score from 0 to 9.")
ANSWER_START = "I think the quality score is: "


def judge_suffix(tokenizer, instruction: str = INSTRUCTION, answer_start: str = ANSWER_START) -> list[int]:
    """Token ids that close the assistant's partial answer and ask the judging question, through the
    tokenizer's chat template (plain text without one)."""
    mark = "\u2063STEP\u2063"  # an invisible marker where the answer so far stands
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Q"}, {"role": "assistant", "content": mark},
             {"role": "user", "content": instruction}, {"role": "assistant", "content": answer_start}],
            tokenize=False, continue_final_message=True)
        suffix = text[text.index(mark) + len(mark) :]
    else:
        suffix = f"\n\n{instruction}\n{answer_start}"
    return tokenizer(suffix, add_special_tokens=False).input_ids


def digit_ids(tokenizer) -> list[int]:
    """The token ids of "0" .. "9", which must be single tokens."""
    ids = [tokenizer(str(d), add_special_tokens=False).input_ids for d in range(10)]
    if any(len(i) != 1 for i in ids):
        raise ValueError("specreason reads a 0-9 score from one token, but this tokenizer splits digits")
    return [i[0] for i in ids]


class SpecReason(StepRule):
    """SpecReason (Pan et al., arXiv 2504.07891): after the verification prefill the target reads a short
    judging turn (one more forward over ~50 tokens on its cache, rolled back afterwards) and its next
    token scores the step 0-9; accept at ``threshold`` or above. ``score="average"`` takes the expected
    digit under the target's distribution over the ten digits, ``"greedy"`` its top token (0 when that is
    not a digit), the authors' two read-outs.

    ``threshold > 9`` rejects every step: exact target decoding.
    """

    name = "specreason"
    needs_extend = True  # the judging turn runs on the row's own cache: one row at a time

    def __init__(self, tokenizer, threshold: float = 7.0, score: str = "average", instruction: str = INSTRUCTION,
                 token_rule: BaseRule | None = None, **veto) -> None:
        super().__init__(token_rule, **veto)
        if tokenizer is None:
            raise ValueError("specreason writes a judging prompt with the target's tokenizer: pass tokenizer= to "
                             "generate() (on the command line, a --target whose tokenizer loads)")
        if score not in ("average", "greedy"):
            raise ValueError(f"score must be 'average' or 'greedy', got {score!r}")
        self.threshold, self.score = float(threshold), score
        self.suffix = torch.tensor([judge_suffix(tokenizer, instruction)])
        self.digits = torch.tensor(digit_ids(tokenizer))

    def judge(self, x: VerifyInput) -> tuple[torch.BoolTensor, dict[str, torch.Tensor]]:
        if x.extend is None:
            raise ValueError("specreason needs the loop's extend() to ask the target about a step (chain drafts only)")
        logits = x.extend(self.suffix.expand(x.draft.tokens.shape[0], -1).to(x.draft.tokens.device))[:, -1].float()
        if self.score == "average":
            digit_probs = logits[:, self.digits].softmax(-1)
            score = (digit_probs * torch.arange(10, device=logits.device)).sum(-1)
        else:
            top = logits.argmax(-1)
            digits = self.digits.to(top.device)
            score = torch.where(top[:, None] == digits, torch.arange(10.0, device=top.device), 0.0).sum(-1)
        return score >= self.threshold, {"judge_score": score}
