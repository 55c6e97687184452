"""Acceptance rules on hand-built tensors: greedy tables, lossless statistics, typical acceptance, properties."""

from __future__ import annotations

import math

import pytest
import scipy.stats
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semverify.engine.noise import sample_from
from semverify.registry import available_rules, get_rule
from semverify.rules import GreedyMatch, SpeculativeSampling, TypicalAcceptance, entropy
from semverify.types import Draft, Verdict, VerifyInput
from tests.helpers import check_verdict_bounds

# ----------------------------------------------------------------------------------------------------------------------
# helpers


def make_input(tokens, target_logits, probs=None, do_sample=False, seed=0) -> VerifyInput:
    """A VerifyInput over the given tensors with a generator seeded by ``seed``."""
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    return VerifyInput(draft=Draft(tokens=tokens, probs=probs), target_logits=target_logits,
                       do_sample=do_sample, generator=torch.Generator().manual_seed(seed))


def logits_with_argmax(argmaxes, vocab: int = 10) -> torch.Tensor:
    """[B, L, V] logits whose argmax at each position is the given token (noise keeps the rest distinct)."""
    t = torch.as_tensor(argmaxes, dtype=torch.long)
    noise = torch.rand(*t.shape, vocab, generator=torch.Generator().manual_seed(7))
    return noise + 5.0 * torch.nn.functional.one_hot(t, vocab).float()


def prefix(n: torch.Tensor, k: int) -> torch.Tensor:
    """[B, k] bool mask of the first n[b] positions (written independently of the library's helper)."""
    return torch.stack([torch.tensor([i < int(m) for i in range(k)], dtype=torch.bool) for m in n]).reshape(len(n), k)


def assert_same_verdict(a: Verdict, b: Verdict) -> None:
    """Two verdicts have equal counts, next tokens and reason masks."""
    assert torch.equal(a.n_accepted, b.n_accepted)
    assert torch.equal(a.next_token, b.next_token)
    assert a.reasons.keys() == b.reasons.keys()
    for name in a.reasons:
        assert torch.equal(a.reasons[name], b.reasons[name])


# ----------------------------------------------------------------------------------------------------------------------
# GreedyMatch unit tables


GREEDY_TABLE = [
    # draft tokens, target argmax at k+1 positions, expected n, expected next token
    pytest.param([1, 2, 3], [1, 2, 3, 4], 3, 4, id="perfect-match-bonus"),
    pytest.param([1, 2, 3], [5, 2, 3, 4], 0, 5, id="mismatch-first"),
    pytest.param([1, 2, 3], [1, 5, 3, 4], 1, 5, id="mismatch-second"),
    pytest.param([1, 2, 3], [1, 2, 5, 4], 2, 5, id="mismatch-last"),
    pytest.param([1, 2, 3], [1, 9, 3, 4], 1, 9, id="no-accept-after-mismatch"),
    pytest.param([7], [7, 8], 1, 8, id="k1-match"),
    pytest.param([7], [6, 8], 0, 6, id="k1-mismatch"),
    pytest.param([4, 4, 4, 4, 4], [4, 4, 4, 4, 4, 0], 5, 0, id="k5-repeated-match"),
]


@pytest.mark.parametrize("draft,target,n,nxt", GREEDY_TABLE)
def test_greedy_table(draft, target, n, nxt):
    x = make_input([draft], logits_with_argmax([target]))
    v = GreedyMatch()(x)
    assert v.n_accepted.tolist() == [n]
    assert v.next_token.tolist() == [nxt]
    assert torch.equal(v.reasons["exact"], prefix(v.n_accepted, len(draft)))


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_empty_draft(batch):
    logits = logits_with_argmax([[2 + b] for b in range(batch)])
    x = make_input(torch.empty(batch, 0, dtype=torch.long), logits)
    v = GreedyMatch()(x)
    assert v.n_accepted.tolist() == [0] * batch
    assert v.next_token.tolist() == [2 + b for b in range(batch)]
    assert v.reasons["exact"].shape == (batch, 0)


def test_greedy_batch_rows_differ():
    draft = [[1, 2, 3], [1, 2, 3], [1, 2, 3]]
    target = [[1, 2, 3, 9], [1, 6, 3, 9], [0, 2, 3, 9]]
    v = GreedyMatch()(make_input(draft, logits_with_argmax(target)))
    assert v.n_accepted.tolist() == [3, 1, 0]
    assert v.next_token.tolist() == [9, 6, 0]
    assert v.reasons["exact"].tolist() == [[True, True, True], [True, False, False], [False, False, False]]
    assert v.n_accepted.dtype == torch.long and v.next_token.dtype == torch.long


@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("k", [0, 1, 4])
def test_speculative_greedy_equals_greedy_match(k, with_probs):
    g = torch.Generator().manual_seed(k)
    B, V = 64, 6
    logits = torch.randn(B, k + 1, V, generator=g)
    # half of the rows draft the target's argmax so every n in 0..k shows up
    tokens = torch.where(torch.rand(B, k, generator=g) < 0.7, logits[:, :k].argmax(-1),
                         torch.randint(0, V, (B, k), generator=g))
    probs = torch.softmax(torch.randn(B, k, V, generator=g), -1) if with_probs else None
    spec = SpeculativeSampling()(make_input(tokens, logits, probs, do_sample=False))
    greedy = GreedyMatch()(make_input(tokens, logits, probs, do_sample=False))
    assert torch.equal(spec.n_accepted, greedy.n_accepted)
    assert torch.equal(spec.next_token, greedy.next_token)
    if k:
        assert len(set(spec.n_accepted.tolist())) > 1


# ----------------------------------------------------------------------------------------------------------------------
# SpeculativeSampling is lossless: statistical checks

ROWS = 200_000
P_VALUE_MIN = 1e-4
TV_MAX = 0.01
MIN_SAMPLES = 10_000
CASES = ["random", "close", "disjoint", "p_zeros", "q_zeros", "equal", "none"]


def _dirichlet(vocab: int, g: torch.Generator) -> torch.Tensor:
    """A Dirichlet(1, ..., 1) draw in float64."""
    e = -torch.log(torch.rand(vocab, generator=g, dtype=torch.float64).clamp_min(1e-12))
    return e / e.sum()


def _top(p: torch.Tensor, keep: int) -> torch.Tensor:
    """p restricted to its ``keep`` largest entries, renormalised (a top-k warped distribution)."""
    out = torch.zeros_like(p)
    idx = p.topk(keep).indices
    out[idx] = p[idx]
    return out / out.sum()


def make_case(case: str, vocab: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target p [k+1, V] and draft q [k, V] (None: deterministic drafter) for a named (p, q) shape, float32."""
    g = torch.Generator().manual_seed(seed)
    p = torch.stack([_dirichlet(vocab, g) for _ in range(k + 1)])
    q = torch.stack([_dirichlet(vocab, g) for _ in range(k)])
    if case == "close":
        q = 0.9 * p[:k] + 0.1 * q
    elif case == "disjoint":
        even = (torch.arange(vocab) % 2 == 0).double()
        p = p * even
        q = q * (1 - even)
    elif case == "p_zeros":
        p = torch.stack([_top(row, 3) for row in p])
    elif case == "q_zeros":
        q = torch.stack([_top(row, 3) for row in q])
    elif case == "equal":
        q = p[:k].clone()
    elif case == "none":
        q = None
    elif case != "random":
        raise ValueError(case)
    p = (p / p.sum(-1, keepdim=True)).float()
    q = None if q is None else (q / q.sum(-1, keepdim=True)).float()
    return p, q


def draft_tokens(p: torch.Tensor, q: torch.Tensor | None, rows: int, g: torch.Generator) -> torch.Tensor:
    """[rows, k] draft tokens: column i drawn from q[i]; with q None an arbitrary fixed rule (half propose p's mode)."""
    k, vocab = p.shape[0] - 1, p.shape[-1]
    if q is None:
        b = torch.arange(rows)[:, None]
        i = torch.arange(k)[None, :]
        pattern = (b * 5 + 3 * i + (b // vocab)) % vocab
        return torch.where(b % 2 == 0, p[:k].argmax(-1)[None, :], pattern)
    return torch.stack([torch.multinomial(q[i], rows, replacement=True, generator=g) for i in range(k)], dim=1)


def run_rule(rule, p: torch.Tensor, q: torch.Tensor | None, rows: int, seed: int):
    """Sample drafts from q for ``rows`` rows sharing (p, q) and apply ``rule`` with do_sample=True."""
    k, vocab = p.shape[0] - 1, p.shape[-1]
    g = torch.Generator().manual_seed(seed)
    tokens = draft_tokens(p, q, rows, g)
    probs = None if q is None else q.expand(rows, k, vocab)
    x = VerifyInput(draft=Draft(tokens=tokens, probs=probs), target_logits=torch.log(p).expand(rows, k + 1, vocab),
                    do_sample=True, generator=g)
    return tokens, rule(x)


def emitted(tokens: torch.Tensor, v: Verdict, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (j+1)-th emitted token (j < k) of the rows that emit at least j+1 tokens, and those rows' mask."""
    n = v.n_accepted
    rows = n >= j
    tok = torch.where(n > j, tokens[:, j], v.next_token)
    return tok[rows], rows


def tv_bound(n: int) -> float:
    """TV_MAX for 50k+ samples, widened like 1/sqrt(n) for fewer (sampling noise of the empirical TV)."""
    return TV_MAX * max(1.0, math.sqrt(50_000 / max(n, 1)))


def distribution_check(samples: torch.Tensor, p: torch.Tensor) -> dict:
    """Chi-square and total-variation check of integer samples against p; ``ok`` is the verdict."""
    p = p.double()
    p = p / p.sum()
    counts = torch.bincount(samples, minlength=p.numel()).double()
    total = float(counts.sum())
    leaked = int(counts[p == 0].sum())
    expected = p * total
    support = p > 0
    obs, exp = counts[support], expected[support]
    small = exp < 5  # merge sparse categories into one bin
    if small.any():
        obs = torch.cat([obs[~small], obs[small].sum()[None]])
        exp = torch.cat([exp[~small], exp[small].sum()[None]])
    if float(obs.sum()) == 0:
        pvalue = 0.0  # nothing landed on p's support
    elif obs.numel() > 1:
        pvalue = float(scipy.stats.chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)
    else:
        pvalue = 1.0
    tv = 0.5 * float((counts / total - p).abs().sum())
    ok = total >= MIN_SAMPLES and leaked == 0 and pvalue > P_VALUE_MIN and tv < tv_bound(int(total))
    return {"ok": ok, "pvalue": pvalue, "tv": tv, "leaked": leaked, "n": int(total)}


def lossless_check(rule, case: str, vocab: int, k: int, seed: int = 0) -> list[dict]:
    """Checks of the first (and, for k >= 2, second) emitted token against p; one dict per position."""
    p, q = make_case(case, vocab, k, seed)
    tokens, v = run_rule(rule, p, q, ROWS, seed + 1)
    results = []
    for j in range(min(k, 2)):
        sample, _ = emitted(tokens, v, j)
        results.append(distribution_check(sample, p[j]))
    return results


def assert_no_zero_prob_emitted(p: torch.Tensor, tokens: torch.Tensor, v: Verdict) -> None:
    """Accepted draft tokens and the next token all have positive target probability where emitted."""
    k = tokens.shape[1]
    n = v.n_accepted
    if k:
        p_tok = p[torch.arange(k), tokens]  # [rows, k]
        accepted = torch.arange(k)[None, :] < n[:, None]
        assert bool((p_tok[accepted] > 0).all())
    assert bool((p[n, v.next_token] > 0).all())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("vocab", [8, 16])
def test_speculative_sampling_is_lossless(case, k, vocab):
    seed = 1000 * vocab + 10 * k + CASES.index(case)
    p, q = make_case(case, vocab, k, seed)
    tokens, v = run_rule(SpeculativeSampling(), p, q, ROWS, seed + 1)
    assert bool(((v.n_accepted >= 0) & (v.n_accepted <= k)).all())
    assert_no_zero_prob_emitted(p, tokens, v)
    for j in range(min(k, 2)):
        sample, rows = emitted(tokens, v, j)
        if case == "disjoint" and j == 1:
            assert not rows.any()  # p and q never agree, so nothing is accepted at position 0
            continue
        result = distribution_check(sample, p[j])
        assert result["n"] >= MIN_SAMPLES, (j, result)
        assert result["leaked"] == 0, result
        assert result["pvalue"] > P_VALUE_MIN, (j, result)
        assert result["tv"] < tv_bound(result["n"]), (j, result)
        assert result["ok"]
    # acceptance rate at position 0 is sum_x min(p, q) (q one-hot on the draft token when q is None)
    if q is not None:
        beta = float(torch.minimum(p[0], q[0]).sum())
        rate = float((v.n_accepted >= 1).double().mean())
        assert abs(rate - beta) < 5 * math.sqrt(max(beta * (1 - beta), 1e-6) / ROWS) + 1e-6


def test_speculative_p_equals_q_accepts_everything_and_bonus_is_p():
    vocab, k = 16, 3
    p, q = make_case("equal", vocab, k, seed=5)
    tokens, v = run_rule(SpeculativeSampling(), p, q, ROWS, seed=6)
    assert bool((v.n_accepted == k).all())
    assert bool(v.reasons["ratio"].all())
    result = distribution_check(v.next_token, p[k])
    assert result["ok"], result


# ----------------------------------------------------------------------------------------------------------------------
# negative controls: the same check must reject broken rules


class AcceptAll(SpeculativeSampling):
    """Broken: keeps every draft token and draws the bonus from p at position k."""

    def __call__(self, x: VerifyInput) -> Verdict:
        n = torch.full((x.draft.tokens.shape[0],), x.k, dtype=torch.long)
        everything = torch.ones_like(x.draft.tokens, dtype=torch.bool)
        return Verdict(n, sample_from(x.target_probs[:, x.k], x.generator), {"ratio": everything})


class ResidualFromP(SpeculativeSampling):
    """Broken: correct acceptance test, but a rejection draws from p instead of (p - q)+."""

    def __call__(self, x: VerifyInput) -> Verdict:
        v = super().__call__(x)
        n = v.n_accepted
        p_n = x.target_probs[torch.arange(n.shape[0]), n]
        return Verdict(n, sample_from(p_n, x.generator), v.reasons)


@pytest.mark.parametrize("broken", [AcceptAll, ResidualFromP])
@pytest.mark.parametrize("k", [1, 3])
def test_negative_control_broken_rule_fails_check(broken, k):
    results = lossless_check(broken(), "random", 8, k, seed=3)
    first = results[0]
    assert not first["ok"], first
    assert first["pvalue"] < 1e-10, first
    # the correct rule passes on the very same case and seed
    assert all(r["ok"] for r in lossless_check(SpeculativeSampling(), "random", 8, k, seed=3))


def test_negative_control_accept_all_leaks_zero_prob_tokens():
    results = lossless_check(AcceptAll(), "disjoint", 8, 1, seed=4)
    assert results[0]["leaked"] > 0 and not results[0]["ok"]


def test_speculative_never_accepts_zero_prob_draft_when_u_is_zero(monkeypatch):
    """torch.rand draws from [0, 1): u == 0 (probability 2**-24 per draw) must not accept a p(x) == 0 token."""
    real_rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **kw: real_rand(*a, **kw) * 0.0)
    p = torch.tensor([[[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]])
    x = make_input([[0]], torch.log(p), probs=torch.tensor([[[1.0, 0.0, 0.0]]]), do_sample=True)
    v = SpeculativeSampling()(x)
    assert v.n_accepted.tolist() == [0], "a token with target probability 0 was accepted"
    assert v.next_token.item() in (1, 2)


# ----------------------------------------------------------------------------------------------------------------------
# determinism


@pytest.mark.parametrize("rule", [GreedyMatch(), SpeculativeSampling(), TypicalAcceptance()])
def test_same_seed_same_verdict(rule):
    g = torch.Generator().manual_seed(11)
    B, k, V = 256, 4, 12
    logits = torch.randn(B, k + 1, V, generator=g)
    probs = torch.softmax(torch.randn(B, k, V, generator=g), -1)
    tokens = sample_from(probs, g)
    a = rule(make_input(tokens, logits, probs, do_sample=True, seed=3))
    b = rule(make_input(tokens, logits, probs, do_sample=True, seed=3))
    assert_same_verdict(a, b)
    c = rule(make_input(tokens, logits, probs, do_sample=True, seed=4))
    assert not torch.equal(c.next_token, a.next_token)


# ----------------------------------------------------------------------------------------------------------------------
# TypicalAcceptance


def test_typical_confident_target_accepts_argmax():
    p = torch.tensor([[[0.95, 0.0125, 0.0125, 0.0125, 0.0125], [0.1, 0.6, 0.1, 0.1, 0.1]]])
    v = TypicalAcceptance()(make_input([[0]], torch.log(p)))
    assert v.n_accepted.tolist() == [1]
    assert v.next_token.tolist() == [1]
    assert v.reasons["exact"].tolist() == [[True]]
    assert v.reasons["typical"].tolist() == [[False]]


def test_typical_confident_target_rejects_unlikely_token():
    p = torch.tensor([[[0.95, 0.0125, 0.0125, 0.0125, 0.0125], [0.1, 0.6, 0.1, 0.1, 0.1]]])
    rule = TypicalAcceptance()
    bound = min(rule.posterior_threshold, rule.posterior_alpha * math.exp(-float(entropy(p[0, 0]))))
    assert 0.0125 < bound
    v = rule(make_input([[3]], torch.log(p)))
    assert v.n_accepted.tolist() == [0]
    assert v.next_token.tolist() == [0]
    assert not v.reasons["exact"].any() and not v.reasons["typical"].any()


def test_typical_flat_target_accepts_plausible_non_argmax():
    flat = [0.2, 0.15, 0.15, 0.1, 0.1, 0.1, 0.1, 0.1]
    p = torch.tensor([[flat, [0.05, 0.05, 0.65, 0.05, 0.05, 0.05, 0.05, 0.05], flat]])
    rule = TypicalAcceptance(posterior_threshold=0.09, posterior_alpha=0.3)
    h = float(entropy(p[0, 0]))
    bound = min(0.09, 0.3 * math.exp(-h))
    assert 0.15 > bound and 0.15 < 0.2  # plausible but not the argmax
    v = rule(make_input([[1, 2]], torch.log(p)))
    assert v.n_accepted.tolist() == [2]
    assert v.next_token.tolist() == [0]
    assert v.reasons["typical"].tolist() == [[True, False]]
    assert v.reasons["exact"].tolist() == [[False, True]]
    assert v.target_tokens.tolist() == [[0, 2]]  # the argmaxes, so stats log the kept 1 as a substitution of 0


def test_typical_bound_uses_threshold_when_smaller():
    # flat target: alpha * exp(-H) is large when alpha is large, so the threshold eps decides
    flat = torch.tensor([0.3, 0.25, 0.25, 0.2])
    p = torch.stack([flat, flat])[None]
    accept = TypicalAcceptance(posterior_threshold=0.22, posterior_alpha=10.0)(make_input([[1]], torch.log(p)))
    reject = TypicalAcceptance(posterior_threshold=0.22, posterior_alpha=10.0)(make_input([[3]], torch.log(p)))
    assert accept.n_accepted.tolist() == [1] and accept.reasons["typical"].tolist() == [[True]]
    assert reject.n_accepted.tolist() == [0]


def _random_greedy_inputs(seed: int):
    """Random logits and drafts where drafts often hit the argmax (so n varies), k=4."""
    g = torch.Generator().manual_seed(seed)
    B, k, V = 512, 4, 10
    logits = torch.randn(B, k + 1, V, generator=g) * 1.5
    tokens = torch.where(torch.rand(B, k, generator=g) < 0.6, logits[:, :k].argmax(-1),
                         torch.randint(0, V, (B, k), generator=g))
    return tokens, logits


def test_typical_lossless_limit_is_greedy():
    """The documented lossless limit (threshold 1, alpha inf) is exact greedy matching."""
    tokens, logits = _random_greedy_inputs(0)
    typical = TypicalAcceptance(posterior_threshold=1.0, posterior_alpha=float("inf"))(make_input(tokens, logits))
    greedy = GreedyMatch()(make_input(tokens, logits))
    assert not typical.reasons["typical"].any(), "threshold=1.0 still accepts non-argmax tokens as typical"
    assert torch.equal(typical.n_accepted, greedy.n_accepted)
    assert torch.equal(typical.next_token, greedy.next_token)


def test_typical_rejects_negative_params():
    with pytest.raises(ValueError):
        TypicalAcceptance(posterior_threshold=-0.1)
    with pytest.raises(ValueError):
        TypicalAcceptance(posterior_alpha=-1.0)


# ----------------------------------------------------------------------------------------------------------------------
# property-based


@st.composite
def verify_inputs(draw):
    """(VerifyInput, rule) with random shapes, -inf entries, and optional draft probs."""
    vocab = draw(st.integers(2, 20))
    k = draw(st.integers(0, 5))
    batch = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    do_sample = draw(st.booleans())
    with_probs = draw(st.booleans())
    inf_frac = draw(st.sampled_from([0.0, 0.3, 0.8]))
    scale = draw(st.sampled_from([0.5, 3.0, 30.0]))
    rule = draw(st.sampled_from(["greedy", "speculative", "typical"]))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=g) * scale
    masked = torch.rand(batch, k + 1, vocab, generator=g) < inf_frac
    keep = torch.nn.functional.one_hot(torch.randint(0, vocab, (batch, k + 1), generator=g), vocab).bool()
    logits = logits.masked_fill(masked & ~keep, float("-inf"))
    tokens = torch.randint(0, vocab, (batch, k), generator=g)
    probs = None
    if with_probs:
        q = torch.rand(batch, k, vocab, generator=g) * (torch.rand(batch, k, vocab, generator=g) < 0.6)
        q = q.scatter(-1, tokens[..., None], torch.rand(batch, k, 1, generator=g) + 0.01)
        probs = q / q.sum(-1, keepdim=True)
    x = VerifyInput(draft=Draft(tokens=tokens, probs=probs), target_logits=logits, do_sample=do_sample,
                    generator=torch.Generator().manual_seed(seed + 1))
    return x, get_rule(rule)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(verify_inputs())
def test_rule_properties(case):
    x, rule = case
    B, k = x.draft.tokens.shape[0], x.k
    v = rule(x)
    n, nxt = check_verdict_bounds(x, v)
    p = x.target_probs
    if k:
        p_tok = p[:, :k].gather(-1, x.draft.tokens[..., None]).squeeze(-1)
        assert bool((p_tok[prefix(n, k)] > 0).all()), "accepted a draft token with target probability 0"
    union = torch.zeros(B, k, dtype=torch.bool)
    for name, mask in v.reasons.items():
        assert mask.shape == (B, k) and mask.dtype == torch.bool, name
        assert not bool((union & mask).any()), "reason masks overlap"
        union |= mask
    assert torch.equal(union, prefix(n, k))
    if not x.do_sample:
        assert torch.equal(nxt, x.target_logits[torch.arange(B), n].argmax(-1))


# ----------------------------------------------------------------------------------------------------------------------
# registry


def test_available_rules():
    names = available_rules()
    assert {"greedy", "speculative", "typical"} <= set(names)
    assert names == sorted(names)


def test_get_rule_by_name_and_params():
    assert isinstance(get_rule("greedy"), GreedyMatch)
    assert isinstance(get_rule("speculative"), SpeculativeSampling)
    rule = get_rule("typical", posterior_threshold=0.2, posterior_alpha=0.5)
    assert isinstance(rule, TypicalAcceptance)
    assert rule.posterior_threshold == 0.2 and rule.posterior_alpha == 0.5


def test_get_rule_unknown_name_lists_available():
    with pytest.raises(ValueError) as info:
        get_rule("nope")
    msg = str(info.value)
    assert "nope" in msg
    for name in ("greedy", "speculative", "typical"):
        assert name in msg


def test_get_rule_object_passthrough_and_params_error():
    rule = GreedyMatch()
    assert get_rule(rule) is rule
    with pytest.raises(ValueError):
        get_rule(rule, posterior_threshold=0.1)
    with pytest.raises(TypeError):
        get_rule(42)


def test_rule_flags():
    assert GreedyMatch.lossless and SpeculativeSampling.lossless and not TypicalAcceptance.lossless
    for rule in (GreedyMatch(), SpeculativeSampling(), TypicalAcceptance()):
        assert rule.name in available_rules()
