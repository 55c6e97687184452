"""The engine draws what a token rule decides: the rule states its law at each drafted position (`TokenLaw`), and
`decide` turns that law into a verdict in every mode, so no rule carries a branch per mode.

- Greedy decoding: keep while a(x) is 1; then the refusal law's argmax (the target's own after a full draft).
- Uncoupled sampling: one uniform u per position from the row's stream; keep while u < a(x); then a draw from the
  refusal law r_x (from p after a full draft).
- Coupled noise: y = the Gumbel-max of the emitted law mu under the target stream's noise at each position (for a
  lossless rule mu = p, so y is the target's own token); keep while x = y; then y. The emitted token then has law
  mu however x was drawn, from the same noise included: coupling correlates a method with the others, it never
  changes it, and a lossless rule still equals the target alone token for token.
"""

from __future__ import annotations

import torch

from ..types import REFUSALS, Judge, TokenLaw, Verdict, VerifyInput
from .argmax import vocab_argmax
from .noise import sample_from, target_noise, uniform

_EMPTY = 1e-12  # a distribution with less mass than this left after removing a token falls back to p


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


def draft_probs(x: VerifyInput) -> torch.Tensor:
    """[B, k, V] q: the draft's distribution, one-hot on the drafted tokens for a deterministic drafter."""
    if x.draft.probs is not None:
        return x.draft.probs.float()
    vocab = x.target_logits.shape[-1]
    return torch.zeros(*x.draft.tokens.shape, vocab, device=x.target_logits.device).scatter_(
        -1, x.draft.tokens[..., None], 1.0)


def check_law(law: TokenLaw, x: VerifyInput, name: str) -> None:
    """Refuse a law of the wrong shape with one line (a plugin's law is otherwise silently broadcast)."""
    want = (*x.draft.tokens.shape, x.target_logits.shape[-1])
    if not isinstance(law, TokenLaw) or tuple(law.keep.shape) != want:
        got = type(law).__name__ if not isinstance(law, TokenLaw) else f"keep of shape {tuple(law.keep.shape)}"
        raise ValueError(f"rule {name!r}: law() must return a TokenLaw whose keep is [batch, k, vocab] = {want}, "
                         f"got {got}")


def _weight(w: torch.Tensor | float, rows: torch.Tensor, at: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """A refusal weight (a number, or [B, k, V] over candidates, or [B, k, 1]) for the drafted token at each row's
    position."""
    if isinstance(w, torch.Tensor) and w.dim() == 3:
        w = w[rows, at].float()
        return w[:, 0] if w.shape[-1] == 1 else w.gather(-1, tok[:, None])[:, 0]
    return torch.full(rows.shape, float(w), device=rows.device)


def _without(p: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """[B, V] p without ``tok`` [B], renormalised (p itself where nothing is left)."""
    rest = p.scatter(-1, tok[:, None], 0.0)
    total = rest.sum(-1, keepdim=True)
    return torch.where(total > _EMPTY, rest / total.clamp_min(_EMPTY), p)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[..., V] (p - q)+ of ``p``, ``q`` [..., V], renormalised over the vocabulary (p itself where p = q)."""
    res = (p - q).clamp_min(0.0)
    total = res.sum(-1, keepdim=True)
    return torch.where(total > _EMPTY, res / total.clamp_min(_EMPTY), p)


def refusal_law(law: TokenLaw, x: VerifyInput, n: torch.LongTensor) -> torch.Tensor:
    """[B, V] the law (unnormalised weights) of the token emitted on refusing each row's drafted token at n [B]."""
    k, tokens = x.k, x.draft.tokens
    rows, at = torch.arange(tokens.shape[0], device=tokens.device), n.clamp(max=k - 1)
    tok = tokens[rows, at]
    if law.refuse is not None:
        return law.refuse(at, tok)
    p = x.target_probs[rows, at]
    q = None if x.draft.probs is None else x.draft.probs[rows, at].float()
    w = {name: _weight(getattr(law, name), rows, at, tok)[:, None] for name in REFUSALS}
    out = w["target"] * p
    if q is None:  # one-hot q: (p - q)+ is p without the drafted token
        out = out + (w["without"] + w["residual"]) * _without(p, tok) + w["draft"] * torch.zeros_like(p).scatter(
            -1, tok[:, None], 1.0)
    else:
        out = out + w["without"] * _without(p, tok) + w["residual"] * _residual(p, q) + w["draft"] * q
    return out


def emitted_law(law: TokenLaw, x: VerifyInput) -> torch.Tensor:
    """[B, k, V] mu, the law of the token emitted at each drafted position, marginal over the draft token:
    sum_y q(y) [a(y) 1{. = y} + (1 - a(y)) r_y]."""
    if law.uncoupled is not None:
        raise ValueError(law.uncoupled)
    p, q, a = x.target_probs[:, : x.k].float(), draft_probs(x), law.keep.float()
    rest = q * (1.0 - a)  # mass of each candidate that is drafted and refused

    def mass(w: torch.Tensor | float) -> torch.Tensor:
        """[B, k, 1] refused mass weighted by ``w`` (a number, or [B, k, V] or [B, k, 1])."""
        return (rest * w).sum(-1, keepdim=True)

    without = law.without + law.residual if x.draft.probs is None else law.without
    mu = q * a + mass(law.target) * p + mass(law.draft) * q
    if x.draft.probs is not None:
        mu = mu + mass(law.residual) * _residual(p, q)
    share = rest * without  # refused mass that goes to "p without the candidate"
    others = (p.sum(-1, keepdim=True) - p).clamp_min(0.0)
    safe = others > _EMPTY
    per = torch.where(safe, share / others.clamp_min(_EMPTY), torch.zeros_like(share))
    return mu + p * (per.sum(-1, keepdim=True) - per) + torch.where(safe, 0.0, share).sum(-1, keepdim=True) * p


def decide(rule: Judge, x: VerifyInput) -> Verdict:
    """The verdict of a rule that states its law (`TokenLaw`), drawn by the engine in the mode of ``x``: greedy,
    uncoupled (``x.generator`` a torch stream, or one per row) or coupled (`CoupledNoise`, `CoupledRows`). A
    lossless rule under greedy decoding or coupled noise keeps the drafts equal to the target's own tokens (its law
    is not asked for: it is p)."""
    noise = target_noise(x.generator, x.target_logits, x.draft.tokens)  # [B, k+1, V] or None
    if x.do_sample and noise is None:
        return _draw_uncoupled(rule, x)
    return _draw_keyed(rule, x, noise)


def _draw_uncoupled(rule: Judge, x: VerifyInput) -> Verdict:
    """Uncoupled sampling: a coin per position from the row's stream (keep while u < a(x)), then a draw from the
    refusal law at the first refused position (from p after a full draft)."""
    k, tokens, batch = x.k, x.draft.tokens, x.draft.tokens.shape[0]  # tokens [B, k]
    none = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    p_k = at_position(x.target_probs, none + k)  # [B, V] p after a full draft
    if k == 0:
        return Verdict(none, sample_from(p_k, x.generator), {"ratio": tokens.bool()})
    law = _law(rule, x)
    u = uniform((batch, k), x.generator, tokens.device)  # [B, k]
    n = leading_true(u < law.keep.gather(-1, tokens[..., None]).squeeze(-1))  # [B]
    weights = torch.where((n < k)[:, None], refusal_law(law, x, n), p_k)  # [B, V]
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, at_position(x.target_probs, n))
    p_x = x.target_probs[:, :k].gather(-1, tokens[..., None]).squeeze(-1)  # [B, k]
    q_x = torch.ones_like(p_x) if x.draft.probs is None else x.draft.probs.gather(-1, tokens[..., None])[..., 0]
    strict = u * q_x < p_x  # [B, k] where speculative sampling's own test keeps the token
    return _verdict(None if rule.lossless else law, n, sample_from(weights, x.generator), strict, "ratio",
                    torch.where(strict, tokens, vocab_argmax(x.target_logits[:, :k])))


def _draw_keyed(rule: Judge, x: VerifyInput, noise: torch.Tensor | None) -> Verdict:
    """Greedy decoding (``noise`` None: keep where a(x) is 1, then the refusal law's argmax) or coupled noise (the
    Gumbel-max of the emitted law under the target's ``noise`` [B, k+1, V]; a lossless rule keeps the drafts equal
    to the target's own coupled tokens)."""
    k, tokens, logits = x.k, x.draft.tokens, x.target_logits.float()  # tokens [B, k], logits [B, k+1, V]
    own = vocab_argmax(logits if noise is None else logits + noise)  # [B, k+1] the target's own tokens
    if k == 0:
        return Verdict(own.new_zeros(tokens.shape[0]), own[:, 0], {"exact": tokens.bool()})
    law = None if rule.lossless else _law(rule, x)
    if noise is None and law is not None:
        n = leading_true(law.keep.gather(-1, tokens[..., None]).squeeze(-1) > 0.5)  # [B]
        refused = at_position(own, n) if _own_refusal(law) else vocab_argmax(refusal_law(law, x, n))
        next_token = torch.where(n < k, refused, own[:, k])
    else:
        chosen = own[:, :k] if law is None else vocab_argmax(emitted_law(law, x).log() + noise[:, :k])  # [B, k]
        n = leading_true(tokens == chosen)
        next_token = at_position(torch.cat([chosen, own[:, k:]], dim=1), n)
    return _verdict(law, n, next_token, tokens == own[:, :k], "exact", own[:, :k])


def _law(rule: Judge, x: VerifyInput) -> TokenLaw:
    """The rule's law for ``x``, checked."""
    law = rule.law(x)
    check_law(law, x, rule.name)
    return law


def _own_refusal(law: TokenLaw) -> bool:
    """Whether a refusal emits the target's own token (its whole weight on p, no custom refusal)."""
    return law.refuse is None and all(not isinstance(getattr(law, name), torch.Tensor) and
                                      float(getattr(law, name)) == (1.0 if name == "target" else 0.0)
                                      for name in REFUSALS)


def _verdict(law: TokenLaw | None, n: torch.LongTensor, next_token: torch.LongTensor, strict: torch.BoolTensor,
             base: str, own: torch.LongTensor) -> Verdict:
    """The verdict with its reasons (``n``, ``next_token`` [B]; ``strict``, ``own`` [B, k]): kept by the lossless
    test (``base``), by a label, or by the rule's reason; a refusal label where the rule refused a token the lossless
    test would have kept. ``law`` None: a lossless rule, whose kept tokens all have the lossless test's reason."""
    k = strict.shape[1]
    kept = prefix_mask(n, k)
    if law is None:
        return Verdict(n, next_token, {base: kept})
    reasons = {base: kept & strict}
    left = kept & ~strict
    for name, mask in law.labels.items():
        reasons[name] = left & mask
        left = left & ~mask
    reasons[law.reason] = reasons.get(law.reason, torch.zeros_like(kept)) | left
    refused_at = prefix_mask(n + 1, k) & ~kept
    for name, mask in law.refusal_labels.items():
        reasons[name] = refused_at & mask & strict
    return Verdict(n, next_token, reasons, target_tokens=own)
