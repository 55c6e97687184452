"""``dtype="fastest"``: each role's dtype is the candidate with the fewest expected seconds per token from the
machine's forward-cost curves; the curves are measured once per machine and read from the cache afterwards."""

from __future__ import annotations

import pytest
import torch

import semverify.cost
from semverify.fastest_dtype import pick, seconds_per_token
from semverify.models import choose_dtype, load_model

LINEAR = {n: 1.0 + n for n in (0, 1, 2, 4, 8, 16)}  # wide forwards cost linearly (bf16 on AVX2)
FLAT = {n: 2.0 for n in (0, 1, 2, 4, 8, 16)}  # twice the one-token cost, but flat (float32 there)


def test_a_draft_costs_its_one_token_forward_a_target_its_best_verification_width():
    assert seconds_per_token(LINEAR, "draft") == 1.0 and seconds_per_token(FLAT, "draft") == 2.0
    assert seconds_per_token(LINEAR, "target") == 1.0  # no width pays: plain decoding
    expected_16 = sum(0.6**j for j in range(17))
    assert seconds_per_token(FLAT, "target") == pytest.approx(2.0 / expected_16)  # the widest pays most
    with pytest.raises(ValueError, match="role"):
        seconds_per_token(FLAT, "verifier")


def test_pick_takes_the_fewest_seconds_per_token_per_role():
    curves = {torch.bfloat16: LINEAR, torch.float32: FLAT}
    draft, target = pick(curves, "draft"), pick(curves, "target")
    assert draft.dtype == torch.bfloat16 and target.dtype == torch.float32
    assert target.seconds_per_token == {"torch.bfloat16": 1.0, "torch.float32": pytest.approx(0.8, abs=0.01)}
    assert target.summary().startswith("target: torch.float32 (0.80") and "torch.bfloat16 1.000" in target.summary()
    assert target.to_dict()["dtype"] == "torch.float32"


def test_fastest_measures_each_candidate_once_then_reads_the_cache(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path))
    measured = []

    def fake_seconds(model, context, sizes, repeats, progress=True):  # bfloat16 slow and linear, float32 flat
        measured.append((model.dtype, sizes))
        return {n: (1.0 + n if model.dtype == torch.bfloat16 else 1.5) for n in sizes}

    monkeypatch.setattr(semverify.cost, "forward_seconds", fake_seconds)
    first = choose_dtype(tiny_checkpoint, "target", progress=False)
    assert first.dtype == torch.float32 and set(first.measured) == {"torch.float32", "torch.bfloat16"}
    assert {sizes for _, sizes in measured} == {semverify.cost.PLAN_SIZES}
    measured.clear()
    again = choose_dtype(tiny_checkpoint, "target", progress=False)
    model, _ = load_model(tiny_checkpoint, dtype="fastest")
    assert measured == [] and again.measured == () and again.dtype == model.dtype == torch.float32
    draft = choose_dtype(tiny_checkpoint, "draft", progress=False)  # the target's curves cover a draft's use
    assert measured == [] and draft.dtype == torch.bfloat16 and draft.seconds_per_token["torch.bfloat16"] == 1.0
    assert load_model(tiny_checkpoint, dtype="fastest", role="draft")[0].dtype == torch.bfloat16


def test_a_short_cached_curve_is_measured_again_with_the_sizes_asked_for(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path))
    sizes_measured = []
    def flat(model, context, sizes, *args, **kwargs):
        sizes_measured.append(sizes)
        return dict.fromkeys(sizes, 1.0)

    monkeypatch.setattr(semverify.cost, "forward_seconds", flat)
    choose_dtype(tiny_checkpoint, "draft", progress=False)  # caches one-token curves only
    choose_dtype(tiny_checkpoint, "target", progress=False)
    assert sizes_measured == [(0,), (0,), semverify.cost.PLAN_SIZES, semverify.cost.PLAN_SIZES]


def test_an_int8_model_has_its_own_curve(tmp_path, monkeypatch):
    from semverify.models import _int8_dynamic
    from tests.helpers import tiny_model

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path))
    model = tiny_model(3, arch="llama")
    path = semverify.cost.cost_file(model)
    assert semverify.cost.cost_file(_int8_dynamic(model)) != path


def test_unknown_dtype_names_the_choices():
    with pytest.raises(ValueError, match="fastest"):
        load_model("anything", dtype="float8")
