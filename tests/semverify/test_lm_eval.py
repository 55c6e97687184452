"""semverify's lm-evaluation-harness model: arguments, generate_until's stop strings, likelihoods, and
lm-eval's own command line on the offline tasks."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from evals.commands.lm_eval import lm_eval_argv  # noqa: E402
from semverify.lm_eval import SemverifyLM  # noqa: E402


def instance(kind: str, args: tuple) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


@pytest.fixture(scope="module")
def lm(tiny_checkpoint):
    return SemverifyLM.create_from_arg_string(f"pretrained={tiny_checkpoint},prompt_lookup_num_tokens=3,dtype=float32,"
                                              "max_gen_toks=24")


def test_generate_until_stops_before_the_first_until_string(lm, tmp_path):
    context = "Question: what is 2 + 2? Answer:"
    ids = lm.tokenizer(context, return_tensors="pt").input_ids
    free = lm.model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)[0, ids.shape[1]:]
    text = lm.tokenizer.decode(free, skip_special_tokens=True)
    stop = next(text[i : i + 2] for i in range(4, len(text) - 2)
                if text[i : i + 2].isascii() and text[i : i + 2].strip())  # two characters the output writes
    [out] = lm.generate_until([instance("generate_until", (context, {"until": [stop], "max_gen_toks": 24}))])
    assert out == text.split(stop)[0] and stop not in out
    lm.generate_until([instance("generate_until", (context, {"until": [], "max_gen_toks": 5}))])
    assert lm.stats[-1]["new_tokens"] == 5 and lm.stats[-1]["tau"] >= 1  # max_gen_toks is the budget
    with pytest.raises(ValueError, match="generation arguments num_beams"):
        lm.generate_until([instance("generate_until", (context, {"until": [], "num_beams": 2}))])


def test_loglikelihood_is_the_targets_own(lm):
    [(logp, greedy)] = lm.loglikelihood([instance("loglikelihood", ("Question: 2 + 2 =", " 4"))])
    context, whole = lm.tok_encode("Question: 2 + 2 ="), lm.tok_encode("Question: 2 + 2 = 4")
    with torch.inference_mode():
        logits = lm.model(torch.tensor([whole])).logits[0].log_softmax(-1)
    expected = sum(float(logits[i - 1, whole[i]]) for i in range(len(context), len(whole)))
    assert logp == pytest.approx(expected, abs=1e-4) and isinstance(greedy, bool)
    [rolling] = lm.loglikelihood_rolling([instance("loglikelihood_rolling", ("Question: 2 + 2 = 4",))])
    assert rolling < 0


def test_arguments_are_checked(tiny_checkpoint):
    with pytest.raises(ValueError, match="does not take temperatur"):
        SemverifyLM.create_from_arg_string(f"pretrained={tiny_checkpoint},temperatur=0.7")
    with pytest.raises(ValueError, match="unknown rule 'nope'"):
        SemverifyLM.create_from_arg_string(f"pretrained={tiny_checkpoint},rule=nope")
    lm = SemverifyLM.create_from_arg_string(f"pretrained={tiny_checkpoint},acceptance=typical,dtype=float32")
    assert lm.rule == "typical"  # the former name of rule


def test_command_arguments_reach_lm_eval():
    argv = lm_eval_argv(["--model_args", "pretrained=x", "--tasks", "semverify_gsm8k", "--output_path", "out/"],
                        "/tasks")
    assert argv[:2] == ["--model", "semverify"] and argv[argv.index("--include_path") + 1] == "/tasks"
    assert argv[argv.index("--model_args") + 1] == "pretrained=x,stats_path=out/semverify_stats.json"
    mine = lm_eval_argv(["--model", "hf", "--include_path", "/mine"], "/tasks")
    assert mine[1] == "hf" and mine[mine.index("--include_path") + 1] == "/mine:/tasks"


@pytest.mark.real
def test_lm_eval_runs_an_offline_task_end_to_end(smollm, tmp_path, monkeypatch):
    from semverify.cli import main

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "lm-eval"
    assert main(["lm-eval", "--model_args", "pretrained=smollm2-135m-instruct,prompt_lookup_num_tokens=8,dtype=float32",
                 "--tasks", "semverify_gsm8k", "--limit", "2", "--gen_kwargs", "max_gen_toks=32",
                 "--output_path", str(out)]) == 0
    [results] = list(out.glob("*/results_*.json"))
    metrics = json.loads(results.read_text())["results"]["semverify_gsm8k"]
    assert {"strict_match,none", "flexible_match,none"} <= set(metrics)
    stats = json.loads((out / "semverify_stats.json").read_text())
    assert stats["generations"] == 2 and stats["drafter"] == "prompt_lookup_num_tokens" and stats["tau"] >= 1
