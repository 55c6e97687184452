"""Law tests for acceptance rules: does a rule emit each token with the law it states, in every mode?

A coupled comparison measures a rule only if coupling leaves the rule's law alone. `check_rule_law` checks a token
rule (one that states its `TokenLaw`) on small vocabularies and random (p, q): its stated emitted law against the
token-by-token statement it is made of, and the tokens it emits in single calls, uncoupled and coupled (the draft
drawn independently, and drawn from the same noise as the target's token, as a coupled draft model draws), against
that law by chi-square at fixed seeds; a lossless rule's law must be p. `check_generate_law` does the same end to end
through `semverify.generate` with a model drafter (the first output token), and `check_coupled_like_uncoupled`
compares coupled with uncoupled runs of any rule, one that decides by itself included. Plugin authors: run
``check_rule_law(MyRule(...))`` in your tests (docs/contributing.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .engine.coupling import CoupledNoise, CoupledRows, counter_gumbel, mix
from .engine.drawing import emitted_law, refusal_law
from .engine.sampling import Sampler
from .types import Draft, VerifyInput

ALPHA = 1e-4  # chi-square p-values below this fail (fixed seeds: a pass is reproducible, not luck)


@dataclass
class LawReport:
    """What a law check found: each check's p-value or gap, and the failures as lines."""

    rule: str
    results: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def raise_if_failed(self) -> "LawReport":
        if self.failures:
            raise AssertionError(f"rule {self.rule!r} does not keep its law:\n  " + "\n  ".join(self.failures))
        return self


def chi_square_p(counts: torch.Tensor, law: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of observed ``counts`` [V] against ``law`` [V] (Pearson, bins of small expectation pooled; a count
    where the law is 0 gives 0)."""
    counts, law = counts.double(), law.double().clamp_min(0)
    law = law / law.sum()
    expected = counts.sum() * law
    if bool(((expected == 0) & (counts > 0)).any()):
        return 0.0
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum()[None]]) if bool(small.any()) else counts[~small]
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if bool(small.any()) else expected[~small]
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    if obs.numel() < 2:
        return 1.0
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor((obs.numel() - 1) / 2.0, dtype=torch.double), stat / 2))


def two_sample_p(a: torch.Tensor, b: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value that counts ``a`` and ``b`` [V] come from one law (Pearson's two-sample chi-square; bins whose pooled
    expectation is small are pooled)."""
    a, b = a.double(), b.double()
    total = a + b
    keep = total > 0
    a, b, total = a[keep], b[keep], total[keep]
    small = total * min(a.sum(), b.sum()) / total.sum() < min_expected
    if bool(small.any()):
        a, b = torch.cat([a[~small], a[small].sum()[None]]), torch.cat([b[~small], b[small].sum()[None]])
        total = a + b
    if a.numel() < 2:
        return 1.0
    ea, eb = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    stat = ((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum()
    return float(torch.special.gammaincc(torch.tensor((a.numel() - 1) / 2.0, dtype=torch.double), stat / 2))


def random_case(vocab: int, k: int, seed: int, spread: float = 1.2, draft_noise: float = 0.8,
                with_q: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Random target logits [1, k+1, V] and a draft q [1, k, V] that resembles p (None: a deterministic drafter)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, k + 1, vocab, generator=g) * spread
    if not with_q:
        return logits, None
    q = torch.softmax(logits[:, :k] + draft_noise * torch.randn(1, k, vocab, generator=g), dim=-1)
    return logits, q


def _inputs(logits: torch.Tensor, q: torch.Tensor | None, tokens: torch.LongTensor, do_sample: bool,
            generator) -> VerifyInput:
    """One VerifyInput of ``tokens`` [N, k] over the same target logits and q for every row."""
    n = tokens.shape[0]
    probs = None if q is None else q.expand(n, -1, -1)
    return VerifyInput(Draft(tokens, probs), logits.expand(n, -1, -1), do_sample, generator=generator)


def stated_law(rule, logits: torch.Tensor, q: torch.Tensor | None, tokens: torch.LongTensor) -> torch.Tensor:
    """[k, V] the rule's emitted law at each position (its `TokenLaw`, marginal over the draft; for a deterministic
    drafter the law given the drafted ``tokens`` [1, k])."""
    return emitted_law(rule.law(_inputs(logits, q, tokens, True, None)), _inputs(logits, q, tokens, True, None))[0]


def token_by_token(rule, logits: torch.Tensor, q: torch.Tensor, position: int) -> torch.Tensor:
    """[V] sum_x q(x) [a(x) 1{. = x} + (1 - a(x)) r_x] at ``position``, each r_x from the rule's refusal (by brute
    force over x, for comparison with the closed form the engine draws coupled runs from)."""
    vocab, k = logits.shape[-1], q.shape[1]
    tokens = torch.zeros(vocab, k, dtype=torch.long)
    tokens[:, position] = torch.arange(vocab)
    x = _inputs(logits, q, tokens, True, None)
    law = rule.law(x)
    a = law.keep[torch.arange(vocab), position, torch.arange(vocab)]
    refusal = refusal_law(law, x, torch.full((vocab,), position))
    refusal = refusal / refusal.sum(-1, keepdim=True).clamp_min(1e-30)
    qx = q[0, position]
    return (qx * a) + ((qx * (1 - a))[:, None] * refusal).sum(0)


def emitted_tokens(rule, x: VerifyInput, position: int) -> tuple[torch.LongTensor, torch.BoolTensor]:
    """The token each row emits at ``position`` and which rows reached it (kept every earlier draft token)."""
    verdict = rule(x)
    n = verdict.n_accepted
    token = torch.where(n > position, x.draft.tokens[:, position], verdict.next_token)
    return token, n >= position


def check_rule_law(rule, *, vocab: int = 6, k: int = 2, cases: int = 4, trials: int = 6000, seed: int = 0,
                   deterministic: bool = False) -> LawReport:
    """Check that a token rule emits each token with its stated law, uncoupled and coupled, at every position: its
    verdicts (``rule(x)``, however it draws them) against its `law`.

    For ``cases`` random (p, q) over ``vocab`` tokens and drafts of ``k``: (1) the closed-form emitted law equals the
    token-by-token statement (refusal laws are laws, keep probabilities in [0, 1]); (2) over ``trials`` single calls
    each, the emitted token at each position (given the earlier ones kept) fits that law by chi-square: uncoupled
    (a torch stream), coupled with drafts drawn apart, and coupled with drafts drawn from the target's own noise;
    (3) a lossless rule's law is p. ``deterministic``: drafts without q (prompt lookup, retrieval), each case drafting
    one fixed chain. Returns a `LawReport` (``.raise_if_failed()`` in a test)."""
    report = LawReport(getattr(rule, "name", type(rule).__name__))
    for case in range(cases):
        logits, q = random_case(vocab, k, mix(seed, case), with_q=not deterministic)
        fixed = torch.randint(0, vocab, (1, k), generator=torch.Generator().manual_seed(mix(seed, case, 1)))
        probe = _inputs(logits, q, fixed, True, None)
        try:
            law = rule.law(probe)
        except NotImplementedError:
            report.failures.append("the rule states no law (BaseRule.law): check it end to end with "
                                   "check_coupled_like_uncoupled instead")
            return report
        if bool((law.keep < 0).any() | (law.keep > 1).any()):
            report.failures.append(f"case {case}: keep probabilities outside [0, 1]")
        try:
            mu = stated_law(rule, logits, q, fixed)
        except ValueError as error:  # a law with no closed form: coupled runs refuse it, uncoupled ones still draw
            mu, report.results[f"case {case} coupled"] = None, float("nan")
            report.results[f"case {case} why"] = str(error)  # type: ignore[assignment]
        p = torch.softmax(logits[0, :k].float(), -1)
        if mu is not None and q is not None:
            for pos in range(k):
                gap = float((token_by_token(rule, logits, q, pos) - mu[pos]).abs().max())
                report.results[f"case {case} closed form pos {pos}"] = gap
                if gap > 1e-5:
                    report.failures.append(f"case {case} position {pos}: the closed-form emitted law is {gap:.2g} "
                                           "from the token-by-token statement")
        if mu is not None and getattr(rule, "lossless", False):
            gap = float((mu - p).abs().max())
            if gap > 1e-5:
                report.failures.append(f"case {case}: a lossless rule's emitted law is {gap:.2g} from p")
        reference = mu if mu is not None or q is None else torch.stack([token_by_token(rule, logits, q, pos)
                                                                        for pos in range(k)])
        for mode in ("uncoupled", "coupled", "coupled, shared draft noise"):
            if mode != "uncoupled" and mu is None:
                continue
            x = _sampled(logits, q, fixed, trials, mode, mix(seed, case, 2))
            for pos in range(k):
                token, reached = emitted_tokens(rule, x, pos)
                counts = torch.bincount(token[reached], minlength=vocab)
                if reference is None:
                    continue
                pval = chi_square_p(counts, reference[pos])
                report.results[f"case {case} {mode} pos {pos}"] = pval
                if pval < ALPHA:
                    report.failures.append(f"case {case} {mode} position {pos}: emitted tokens do not fit the stated "
                                           f"law (chi-square p = {pval:.2g}, {int(reached.sum())} draws)")
    return report


def _sampled(logits: torch.Tensor, q: torch.Tensor | None, fixed: torch.LongTensor, trials: int, mode: str,
             seed: int) -> VerifyInput:
    """``trials`` rows of one case: drafts drawn from q (apart, or from the target stream's noise), or ``fixed``."""
    vocab, k = logits.shape[-1], fixed.shape[1]
    noises = [CoupledNoise(mix(seed, t)) for t in range(trials)]
    if q is None:
        tokens = fixed.expand(trials, -1)
    elif mode == "coupled, shared draft noise":  # the draft's token is the Gumbel-max of q under the target's noise
        g = CoupledRows(noises).gumbel_like(logits.expand(trials, -1, -1))[:, :k]
        tokens = (q.log() + g).argmax(-1)
    else:
        keys = [mix(seed, t, 7) for t in range(trials * k)]
        tokens = (q.log().expand(trials, -1, -1) + counter_gumbel(keys, vocab).reshape(trials, k, vocab)).argmax(-1)
    generator = CoupledRows(noises) if mode.startswith("coupled") else torch.Generator().manual_seed(seed)
    return _inputs(logits, q, tokens, True, generator)


def first_token_law(rule, target, draft, input_ids: torch.LongTensor, temperature: float = 1.0) -> torch.Tensor:
    """[V] the stated law of the first token ``generate`` emits for ``input_ids`` [1, L] with ``rule`` and a draft
    model drafting one token: the rule's emitted law at the target's p and the draft's q there."""
    sampler = Sampler(do_sample=True, temperature=temperature)
    with torch.no_grad():
        p_logits = sampler.warp(target(input_ids).logits[:, -1:])
        q = sampler.probs(draft(input_ids).logits[:, -1:])
    logits = torch.cat([p_logits, p_logits], dim=1)  # the position after the draft does not enter the first token
    return stated_law(rule, logits, q, q.argmax(-1))[0]


def _first_tokens(rule, target, draft, input_ids: torch.LongTensor, rows: int, coupled: bool, seed: int,
                  temperature: float) -> torch.LongTensor:
    """The first output token of ``rows`` runs of ``generate`` on one prompt, in one batch."""
    from .generation import generate  # the public entry point (imported here: generation imports the rules)

    batch = input_ids.expand(rows, -1)
    streams = ([CoupledNoise(mix(seed, r)) for r in range(rows)] if coupled
               else [torch.Generator().manual_seed(mix(seed, r)) for r in range(rows)])
    out = generate(target, batch, attention_mask=torch.ones_like(batch), assistant_model=draft,
                   num_assistant_tokens=1, max_new_tokens=2, do_sample=True, temperature=temperature, top_k=0,
                   rule=rule, generator=streams, pad_token_id=0)
    return out[:, input_ids.shape[1]]


def check_generate_law(rule, target, draft, prompts: list[list[int]], *, rows: int = 3000, seed: int = 0,
                       temperature: float = 1.0) -> LawReport:
    """End to end: the first token ``semverify.generate`` emits with a draft model drafting (one token, from the
    shared noise when coupled), uncoupled and coupled, fits the rule's stated law (chi-square) for each prompt."""
    report = LawReport(getattr(rule, "name", type(rule).__name__))
    vocab = target.config.vocab_size
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        law = first_token_law(rule, target, draft, ids, temperature)
        for coupled in (False, True):
            tokens = _first_tokens(rule, target, draft, ids, rows, coupled, mix(seed, i), temperature)
            pval = chi_square_p(torch.bincount(tokens, minlength=vocab), law)
            mode = "coupled" if coupled else "uncoupled"
            report.results[f"prompt {i} {mode}"] = pval
            if pval < ALPHA:
                report.failures.append(f"prompt {i} {mode}: first tokens do not fit the stated law (chi-square "
                                       f"p = {pval:.2g}, {rows} runs)")
    return report


def check_coupled_like_uncoupled(rule, target, draft, prompts: list[list[int]], *, k: int = 1, new_tokens: int = 1,
                                 rows: int = 3000, seed: int = 0, temperature: float = 1.0) -> LawReport:
    """End to end for any rule (one that decides by itself included): the first ``new_tokens`` output tokens of
    coupled and uncoupled runs have the same law (two-sample chi-square on the joint outcome)."""
    from .generation import generate

    report = LawReport(getattr(rule, "name", type(rule).__name__))
    vocab = target.config.vocab_size
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([prompt]).expand(rows, -1)
        outcomes = []
        for coupled in (False, True):
            streams = ([CoupledNoise(mix(seed, i, r)) for r in range(rows)] if coupled
                       else [torch.Generator().manual_seed(mix(seed, i, r)) for r in range(rows)])
            out = generate(target, ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                           num_assistant_tokens=k, max_new_tokens=new_tokens + k, do_sample=True,
                           temperature=temperature, top_k=0, rule=rule, generator=streams, pad_token_id=0)
            new = out[:, ids.shape[1] : ids.shape[1] + new_tokens]
            code = (new * vocab ** torch.arange(new_tokens)).sum(-1)
            outcomes.append(torch.bincount(code, minlength=vocab**new_tokens))
        pval = two_sample_p(outcomes[0], outcomes[1])
        report.results[f"prompt {i}"] = pval
        if pval < ALPHA:
            report.failures.append(f"prompt {i}: coupled and uncoupled outputs differ in law (two-sample "
                                   f"chi-square p = {pval:.2g}, {rows} runs each)")
    return report


__all__ = ["LawReport", "check_coupled_like_uncoupled", "check_generate_law", "check_rule_law", "chi_square_p",
           "first_token_law", "two_sample_p"]
