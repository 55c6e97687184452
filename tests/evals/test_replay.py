"""Replay: model-free drafters scored on recorded greedy outputs match what the loop measures."""

from __future__ import annotations

import json

import pytest
import torch

from evals.replay import agreeing_length, model_free_drafter, replay, replay_run
from evals.rows import read_rows
from semverify import PromptLookupDrafter, generate
from semverify.cli import main
from semverify.methods import parse_method
from semverify.sense import RetrievalDrafter
from tests.helpers import tiny_model


def test_agreeing_length_takes_the_best_branch():
    tokens, parents = [5, 6, 7, 8, 9], [-1, 0, -1, 2, 2]  # 5-6 | 7-8 | 7-9
    assert agreeing_length(tokens, parents, [7, 9, 1]) == 2
    assert agreeing_length(tokens, parents, [5, 1]) == 1
    assert agreeing_length(tokens, parents, [1]) == 0
    assert agreeing_length([1, 2, 3], None, [1, 2, 4]) == 2
    assert agreeing_length([1, 2, 3], None, [1]) == 1  # the output ends: nothing past it counts


@pytest.mark.parametrize("make_drafter", [
    lambda: PromptLookupDrafter(1),
    lambda: RetrievalDrafter(None, semantic=False, num_candidates=4),  # context lookup, tree drafts
], ids=["prompt_lookup", "retrieval_tree"])
@pytest.mark.parametrize("seed", [0, 1])
def test_replay_reproduces_the_loops_counts(make_drafter, seed):
    model = tiny_model(seed, vocab=32)
    prompt = torch.randint(0, 32, (1, 12), generator=torch.Generator().manual_seed(seed))
    out = generate(model, prompt, drafter=make_drafter(), num_assistant_tokens=6, max_new_tokens=60,
                   do_sample=False, return_dict_in_generate=True)
    stats = out.spec_stats
    assert stats.accepted > 0  # a replay of nothing would agree trivially
    result = replay(make_drafter(), prompt[0].tolist(), out.sequences[0, 12:].tolist(), k=6)
    assert (result.steps, result.accepted, result.tokens) == (stats.steps, stats.accepted, 60)


def test_replay_of_a_compare_run_gives_the_measured_tau(tiny_checkpoint, tmp_path):
    run = tmp_path / "run"
    main(["compare", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--methods", "vanilla,pld",
          "--data", "sample", "--limit", "3", "--max-new-tokens", "32", "--dtype", "float32", "--out", str(run),
          "--no-report"])
    rows = {r["id"]: r for r in read_rows(run) if r["method"] == "pld"}
    measured = sum(r["new_tokens"] for r in rows.values()) / sum(r["steps"] for r in rows.values())
    results = replay_run(run, [parse_method("pld")], progress=False)
    assert results["pld"]["problems"] == 3 and results["pld"]["tau"] == pytest.approx(measured)


def test_replay_errors(tiny_checkpoint, tmp_path, capsys):
    with pytest.raises(ValueError, match="needs the target's hidden states"):
        model_free_drafter(parse_method("dresd"), None, None)
    with pytest.raises(ValueError, match="drafter 'model' needs a model"):
        model_free_drafter(parse_method("sd"), None, None)
    with pytest.raises(ValueError, match="accepts by other criteria"):
        model_free_drafter(parse_method("sense_no_sen"), None, None)
    with pytest.raises(SystemExit, match="no run.json"):
        main(["replay", str(tmp_path)])
    run = tmp_path / "sampled"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"settings": {"do_sample": True}}))
    with pytest.raises(SystemExit, match="sampled run; replay needs greedy outputs"):
        main(["replay", str(run)])
