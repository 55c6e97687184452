"""evals.resync: its batched decoding draws what the library's coupled decoding draws, under both keyings, and
its summary pairs perturbed outputs with the unperturbed ones."""

from types import SimpleNamespace

import pytest
import torch

from evals.resync import decode, summarize
from semverify import CoupledNoise, NoDrafter, Sampler, get_rule
from semverify.engine.loop import speculative_generate
from tests.helpers import tiny_model


@pytest.mark.parametrize("context", [None, 2])
def test_unperturbed_rows_equal_the_librarys_coupled_target_alone(context):
    model = tiny_model(3, vocab=64, init_std=0.3)
    prompts, seeds = [[5, 9, 2, 7], [1, 3], [8, 8, 8, 4, 6]], [10, 11, 12]
    args = SimpleNamespace(max_new_tokens=24, temperature=0.8, context=context or 2)
    scheme = "position" if context is None else "context"
    rows = decode(model, prompts, seeds, scheme, None, args, eos={0}, pad=0)
    for prompt, seed, row in zip(prompts, seeds, rows):
        out, _ = speculative_generate(model, torch.tensor([prompt]), drafter=NoDrafter(), rule=get_rule("speculative"),
                                      k=1, max_new_tokens=24, sampler=Sampler(True, 0.8), eos_token_id=0,
                                      generator=CoupledNoise(seed, context=context, noise="legacy"))
        assert row["output_ids"] == out[0, len(prompt) :].tolist()
        assert row["events"] == 0 and len(row["entropies"]) == len(row["output_ids"])
    perturbed = decode(model, prompts, seeds, scheme, 0.0, args, eos={0}, pad=0)  # every position redrawn
    assert all(p["events"] == len(p["output_ids"]) for p in perturbed)
    assert all(p["output_ids"][0] != r["output_ids"][0] for p, r in zip(perturbed, rows))


def test_summary_counts_discordance_answers_and_shared_tokens():
    def row(scheme, arm, i, ids, correct, answer):
        return {"scheme": scheme, "arm": arm, "id": i, "output_ids": ids, "correct": correct, "answer": answer,
                "events": 1 if arm == "perturbed" else 0}

    rows = [row("position", "base", 0, [1, 2, 3, 4], True, "4"),
            row("position", "perturbed", 0, [1, 9, 3, 4], True, "4"),
            row("position", "base", 1, [5, 6], False, "2"), row("position", "perturbed", 1, [5, 7], True, "3")]
    summary = summarize(rows)["position"]
    assert summary["problems"] == 2 and summary["discordant"] == 1 and summary["same answer"] == 1
    assert summary["identical"] == 0 and summary["base correct"] == 1 and summary["perturbed correct"] == 2
    # after the first divergence, problem 0's [2, 3, 4] and [9, 3, 4] share 2 of 3 tokens each; problem 1's none
    assert summary["tokens shared after the first divergence (mean)"] == round((2 * 2 / 6 + 0) / 2, 3)
    assert summary["events per 100 tokens"] == round(100 * 2 / 6, 2)
