"""Sampler warping (temperature, top-k, top-p) against transformers, and sample_from statistics."""

from __future__ import annotations

import pytest
import scipy.stats
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from semverify.engine.noise import sample_from
from semverify.engine.sampling import Sampler

DRAWS = 50_000


def random_logits(rows: int = 32, vocab: int = 50, seed: int = 0, scale: float = 2.0) -> torch.Tensor:
    """[rows, vocab] continuous random logits (ties have probability zero)."""
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def hf_warp(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """transformers' temperature, top-k, top-p warpers applied in that order."""
    scores = logits.float().clone()
    ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p is not None and top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    return scores


def chi_square_pvalue(samples: torch.Tensor, p: torch.Tensor) -> float:
    """Chi-square goodness-of-fit p-value of integer samples against p (zero-probability bins must be empty)."""
    p = p.double() / p.double().sum()
    counts = torch.bincount(samples.flatten(), minlength=p.numel()).double()
    assert float(counts[p == 0].sum()) == 0, "drew a zero-probability index"
    support = p > 0
    obs, exp = counts[support], p[support] * counts.sum()
    return float(scipy.stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


def choose(s: Sampler, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row the way the loop picks it: argmax when greedy, else a draw from the warped probs."""
    return logits.argmax(dim=-1) if not s.do_sample else sample_from(s.probs(logits), generator)


# ----------------------------------------------------------------------------------------------------------------------
# greedy and temperature


def test_greedy_warp_returns_raw_logits_and_choose_is_argmax():
    logits = random_logits().half()
    s = Sampler(do_sample=False, temperature=0.3, top_k=2, top_p=0.5)
    warped = s.warp(logits)
    assert warped.dtype == torch.float32
    assert torch.equal(warped, logits.float())
    assert torch.equal(choose(s, logits), logits.argmax(-1))
    assert torch.equal(choose(s, logits, torch.Generator().manual_seed(0)), logits.argmax(-1))


def test_greedy_allows_zero_temperature():
    s = Sampler(do_sample=False, temperature=0.0)
    logits = random_logits()
    assert torch.equal(choose(s, logits), logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.25, 0.7, 1.0, 2.5])
def test_temperature_scales(temperature):
    logits = random_logits()
    warped = Sampler(do_sample=True, temperature=temperature).warp(logits)
    torch.testing.assert_close(warped, logits / temperature)
    probs = Sampler(do_sample=True, temperature=temperature).probs(logits)
    torch.testing.assert_close(probs, torch.softmax(logits / temperature, -1))
    torch.testing.assert_close(probs.sum(-1), torch.ones(logits.shape[0]))


# ----------------------------------------------------------------------------------------------------------------------
# top-k


@pytest.mark.parametrize("top_k", [1, 2, 7, 49])
def test_top_k_keeps_exactly_k(top_k):
    logits = random_logits(vocab=50)
    warped = Sampler(do_sample=True, top_k=top_k).warp(logits)
    finite = torch.isfinite(warped)
    assert finite.sum(-1).tolist() == [top_k] * logits.shape[0]
    top = logits.topk(top_k, dim=-1).indices
    assert bool(finite.gather(-1, top).all())
    torch.testing.assert_close(warped[finite], logits[finite])
    assert bool((warped[~finite] == float("-inf")).all())


@pytest.mark.parametrize("top_k", [0, 50, 80])
def test_top_k_disabled_or_at_least_vocab_keeps_all(top_k):
    logits = random_logits(vocab=50)
    assert torch.equal(Sampler(do_sample=True, top_k=top_k).warp(logits), logits)


# ----------------------------------------------------------------------------------------------------------------------
# top-p


@pytest.mark.parametrize("top_p", [1e-6, 0.1, 0.5, 0.8, 0.95])
def test_top_p_keeps_smallest_set_reaching_mass(top_p):
    logits = random_logits(rows=64, vocab=40, seed=3)
    probs = torch.softmax(logits.double(), -1)
    warped = Sampler(do_sample=True, top_p=top_p).warp(logits)
    kept = torch.isfinite(warped)
    assert bool(kept.any(-1).all())
    for row in range(logits.shape[0]):
        p, k = probs[row], kept[row]
        assert bool(k[p.argmax()]), "the most likely token is always kept"
        if (~k).any():
            assert float(p[k].min()) >= float(p[~k].max()), "kept tokens are the most likely ones"
        mass = float(p[k].sum())
        smallest = float(p[k].min())
        if abs(mass - top_p) > 1e-5 and abs(mass - smallest - top_p) > 1e-5:  # skip float-boundary cases
            assert mass >= top_p
            assert k.sum() == 1 or mass - smallest < top_p, "the kept set is not the smallest one"
    torch.testing.assert_close(warped[kept], logits[kept])


def test_top_p_tiny_keeps_only_top_token():
    logits = random_logits(seed=4)
    warped = Sampler(do_sample=True, top_p=1e-9).warp(logits)
    assert torch.isfinite(warped).sum(-1).tolist() == [1] * logits.shape[0]
    assert torch.equal(warped.argmax(-1), logits.argmax(-1))


def test_top_p_one_keeps_all():
    logits = random_logits(seed=5)
    assert torch.equal(Sampler(do_sample=True, top_p=1.0).warp(logits), logits)


# ----------------------------------------------------------------------------------------------------------------------
# against transformers


WARP_SETTINGS = [
    (1.0, None, None),
    (0.7, None, None),
    (1.0, 5, None),
    (1.0, None, 0.9),
    (0.7, 10, None),
    (1.3, None, 0.8),
    (0.7, 10, 0.9),
    (0.5, 3, 0.5),
    (2.0, 40, 0.3),
    (1.0, 1, 0.99),
    (0.9, 64, 0.95),
]


@pytest.mark.parametrize("temperature,top_k,top_p", WARP_SETTINGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_warp_matches_transformers(temperature, top_k, top_p, seed):
    logits = random_logits(rows=48, vocab=64, seed=seed, scale=3.0)
    ours = Sampler(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p).warp(logits)
    theirs = hf_warp(logits, temperature, top_k, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert bool((ours[torch.isinf(ours)] < 0).all())
    finite = torch.isfinite(theirs)
    torch.testing.assert_close(ours[finite], theirs[finite])


def test_warp_batched_shape_matches_flat():
    logits = torch.randn(3, 4, 30, generator=torch.Generator().manual_seed(9))
    s = Sampler(do_sample=True, temperature=0.8, top_k=12, top_p=0.85)
    batched = s.warp(logits)
    assert batched.shape == logits.shape
    flat = s.warp(logits.reshape(-1, 30)).reshape(3, 4, 30)
    assert torch.equal(batched, flat)
    theirs = hf_warp(logits.reshape(-1, 30), 0.8, 12, 0.85).reshape(3, 4, 30)
    assert torch.equal(torch.isinf(batched), torch.isinf(theirs))


# ----------------------------------------------------------------------------------------------------------------------
# argument validation


@pytest.mark.parametrize("kwargs", [
    dict(do_sample=True, temperature=0.0),
    dict(do_sample=True, temperature=-1.0),
    dict(top_p=0.0),
    dict(top_p=1.5),
    dict(top_p=-0.1),
    dict(top_k=-1),
    dict(do_sample=True, top_p=0.0),
    dict(do_sample=True, top_k=-1),
])
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        Sampler(**kwargs)


def test_valid_edge_arguments():
    Sampler(do_sample=True, temperature=1e-3, top_k=0, top_p=1.0)
    Sampler(do_sample=False, temperature=0.0)


# ----------------------------------------------------------------------------------------------------------------------
# sample_from and choose


@pytest.mark.parametrize("probs", [
    torch.tensor([0.5, 0.25, 0.125, 0.125]),
    torch.tensor([0.0, 0.3, 0.0, 0.6, 0.1, 0.0]),
    torch.softmax(torch.randn(20, generator=torch.Generator().manual_seed(1)), 0),
])
def test_sample_from_matches_probs(probs):
    g = torch.Generator().manual_seed(123)
    draws = sample_from(probs.expand(DRAWS, -1), g)
    assert draws.shape == (DRAWS,)
    assert chi_square_pvalue(draws, probs) > 1e-4
    tv = 0.5 * float((torch.bincount(draws, minlength=probs.numel()).double() / DRAWS - probs.double()).abs().sum())
    assert tv < 0.01


def test_sample_from_unnormalised_rows():
    p = torch.tensor([1.0, 3.0, 0.0, 4.0])  # normalises to [1/8, 3/8, 0, 1/2]
    draws = sample_from(p.expand(DRAWS, -1), torch.Generator().manual_seed(5))
    assert chi_square_pvalue(draws, p / p.sum()) > 1e-4


def test_sample_from_reproducible_and_shaped():
    probs = torch.softmax(torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(2)), -1)
    a = sample_from(probs, torch.Generator().manual_seed(7))
    b = sample_from(probs, torch.Generator().manual_seed(7))
    assert a.shape == (2, 3) and a.dtype == torch.long
    assert torch.equal(a, b)
    big = probs[0, 0].expand(1000, -1)
    assert not torch.equal(sample_from(big, torch.Generator().manual_seed(7)),
                           sample_from(big, torch.Generator().manual_seed(8)))


def test_choose_samples_from_warped_probs():
    logits = torch.randn(12, generator=torch.Generator().manual_seed(6)) * 2
    s = Sampler(do_sample=True, temperature=0.8, top_k=6, top_p=0.9)
    probs = s.probs(logits)
    assert int((probs > 0).sum()) <= 6
    draws = choose(s, logits.expand(DRAWS, -1), torch.Generator().manual_seed(9))
    assert chi_square_pvalue(draws, probs) > 1e-4
    again = choose(s, logits.expand(DRAWS, -1), torch.Generator().manual_seed(9))
    assert torch.equal(draws, again)
