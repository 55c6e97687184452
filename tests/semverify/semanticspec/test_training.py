"""Probe data, meaning judges and probe training, end to end on tiny models (the offline builders)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from semverify import get_rule
from semverify.semanticspec import SemanticProbe, StepSegmenter, judges, labelling, training
from semverify.semanticspec.labelling import LabelSettings
from tests.helpers import byte_tokenizer, tiny_model

TOK = byte_tokenizer()
SETTINGS = LabelSettings(samples=3, max_step_tokens=6, per_answer=2, answer_tokens=20)


def tiny_pair():
    target, draft = tiny_model(0, arch="llama", vocab=len(TOK)), tiny_model(1, arch="llama", vocab=len(TOK))
    for m in (target, draft):
        m.generation_config.eos_token_id = TOK.eos_token_id
    return target, draft


def prompts(n: int) -> list[str]:
    return [TOK.apply_chat_template([{"role": "user", "content": f"What is {i} + {i}?" + "?" * i}], tokenize=False,
                                    add_generation_prompt=True) for i in range(n)]


def test_step_ends_are_where_the_step_drafter_cuts():
    seg = StepSegmenter(TOK, max_step_tokens=50)
    ids = TOK("First.\n\nSecond step.\n\nEnd", add_special_tokens=False).input_ids
    ends = labelling.step_ends(ids, seg)
    assert [TOK.decode(ids[:e]) for e in ends] == ["First.\n\n", "First.\n\nSecond step.\n\n"]
    capped = labelling.step_ends(ids, StepSegmenter(TOK, max_step_tokens=4))
    assert capped[:2] == [4, 8]


def test_collect_label_and_train_a_pair_end_to_end(tmp_path):
    target, draft = tiny_pair()
    folder = labelling.collect(target, draft, TOK, prompts(5), tmp_path, SETTINGS, answer_batch=2, group=3,
                               progress=False)
    files = sorted(folder.glob("*.pt"))
    prefixes = [json.loads(line) for line in (tmp_path / "prefixes.jsonl").open()]
    assert len(files) == len(prefixes) > 0 and {p["source"] for p in prefixes} <= {"target", "draft"}
    first = torch.load(files[0], weights_only=True)
    h = target.config.hidden_size
    for side in ("target", "draft"):
        assert len(first[side]["ids"]) == 3 and all(1 <= len(s) <= 6 for s in first[side]["ids"])
        assert first[side]["tokens_mean"].shape == (3, h) and first[side]["stats"][0].shape[1] == len(labelling.STATS)
    assert first["draft"]["emitting"].shape == (3, draft.config.hidden_size)
    # the target's features of its own samples are what a verification prefill over prefix + step gives
    again = labelling.read_steps(target, first["prefix"]["ids"], first["target"]["ids"], SETTINGS.sampler)
    assert torch.allclose(again["tokens_mean"].float(), first["target"]["tokens_mean"].float(), atol=1e-3)
    # resume: nothing is sampled again, and other settings are refused
    stamps = [f.stat().st_mtime_ns for f in files]
    labelling.collect(target, draft, TOK, prompts(5), tmp_path, SETTINGS, answer_batch=2, group=3, progress=False)
    assert [f.stat().st_mtime_ns for f in files] == stamps
    with pytest.raises(ValueError, match="other settings"):
        labelling.collect(target, draft, TOK, prompts(5), tmp_path, LabelSettings(samples=4), progress=False)

    same_text = lambda texts, prefix: [texts.index(t) for t in texts]  # noqa: E731  (same text = same meaning)
    data = training.label_samples(tmp_path, same_text, progress=False)
    n = len(files)
    assert data["target_x"].shape == (6 * n, h) and data["draft_x"].shape == (3 * n, draft.config.hidden_size)
    assert ((data["target_y"] >= 0) & (data["target_y"] <= 1)).all()
    assert (data["target_y"][~data["target_is_draft"]] > 0).all()  # a target sample is at least its own cluster
    assert (data["draft_y"] > 0).all() and torch.equal(data["draft_label_t"], data["target_y"][data["target_is_draft"]])
    d_probe, t_probe, report = training.train_pair(data, "tiny-draft", "tiny-target", width=8, epochs=3, patience=1)
    assert d_probe.meta["pair"] == t_probe.meta["pair"] == report["pair"]
    assert d_probe.meta["role"] == "draft" and t_probe.meta["role"] == "target"
    for name in ("mse", "r2", "auroc_label0", "label_mean", "pred_mean"):
        assert name in report["target"]["test"] and name in report["draft"]["test"]
    assert set(report["test_draft_steps"]["auroc_label0"]) == {"probe_ratio", "probe_target", "mean_logp", "min_logp",
                                                               "neg_max_rank"}
    cv = training.cross_validate(data, folds=2, width=8, epochs=3, patience=1, resamples=20)
    assert cv["n"] == len(data["draft_y"])
    assert set(cv["auroc_label0"]) == set(report["test_draft_steps"]["auroc_label0"])
    report["cross_validated"] = cv
    assert "| probe ratio P_t/P_d |" in training.report_markdown(report)
    d_path, t_path = d_probe.save(tmp_path / "d.pt"), t_probe.save(tmp_path / "t.pt")
    rule = get_rule("semanticspec", draft_probe=str(d_path), target_probe=str(t_path))  # a matched pair
    assert rule.draft_probe.meta["pair"] == report["pair"]


def test_cross_validation_scores_every_draft_step_out_of_fold():
    g = torch.Generator().manual_seed(0)
    groups = torch.arange(12).repeat_interleave(4)  # 12 prefixes, 4 draft steps each
    label = (torch.arange(48) % 4 != 0).float()  # one step a prefix the target never writes
    x = torch.randn(48, 6, generator=g) + 3 * label[:, None]  # states that show the label
    # the target's own log-probability shows it too: -5 for label-0 steps, -0.5 otherwise
    stats = [torch.full((3, 5), -5.0 if y == 0 else -0.5) for y in label]
    data = {"target_x": x, "target_y": label, "target_group": groups,
            "target_is_draft": torch.ones(48, dtype=torch.bool), "draft_x": x, "draft_y": label,
            "draft_group": groups, "draft_label_t": label, "draft_stats": stats}
    cv = training.cross_validate(data, folds=3, width=8, resamples=50)
    assert cv["n"] == 48 and cv["label0_share"] == 0.25 and cv["prefixes"] == 12
    assert cv["auroc_label0"]["mean_logp"] == {"auroc": 1.0, "ci95": [1.0, 1.0]}
    assert cv["auroc_label0"]["probe_target"]["auroc"] > 0.9 and cv["target_on_draft_steps"]["r2"] > 0.5
    # step_likelihood at -0.8 keeps exactly the steps the target writes (mean log-prob -0.5 against -5)
    assert {r["min_mean_logprob"]: r["label0_share_of_accepted"] for r in cv["likelihood_rule"]}[-0.8] == 0.0
    assert all(r["accept_share"] == 0.75 for r in cv["likelihood_rule"] if r["min_mean_logprob"] <= -0.5)
    with pytest.raises(ValueError, match="too few"):
        training.cross_validate(data, folds=7)
    with pytest.raises(ValueError, match="at least 2 folds"):
        training.cross_validate(data, folds=1)


def test_auroc_and_regression_metrics():
    scores = torch.tensor([0.9, 0.8, 0.3, 0.1])
    assert training.auroc(scores, torch.tensor([True, True, False, False])) == 1.0
    assert training.auroc(scores, torch.tensor([False, False, True, True])) == 0.0
    assert training.auroc(torch.ones(4), torch.tensor([True, False, True, False])) == 0.5
    assert math.isnan(training.auroc(scores, torch.ones(4, dtype=torch.bool)))  # one class only
    m = training.regression_metrics(torch.tensor([0.0, 0.5, 1.0]), torch.tensor([0.0, 0.5, 1.0]))
    assert m["r2"] == 1.0 and m["mse"] == 0.0 and m["auroc_label0"] == 1.0 and m["label0_share"] == pytest.approx(1 / 3)


def test_numbers_and_new_numbers():
    assert judges.numbers("2. **Total:** 80,000 + 50,000 = 130,000 and $18.50, -3, 7.0") == {
        "80000", "50000", "130000", "18.5", "-3", "7"}
    assert judges.new_numbers("So 16 - 3 = 13 eggs", "Janet lays 16 eggs and eats 3") == {"13"}
    assert judges.cluster(["a", "b", "a2"], lambda i, j: {i, j} == {0, 2}) == [0, 1, 0]


def test_meaning_judge_needs_the_same_results():
    judge = judges.meaning_judge(threshold=0.8)
    labels = judge(["She has 5 apples in total.", "In total she has 5 apples.", "In total she has 6 apples.",
                    "The train leaves at noon."], "Question: 2 and 3 apples")
    assert labels[0] == labels[1] and len({labels[1], labels[2], labels[3]}) == 3
    loose = judges.meaning_judge(threshold=0.8, require_numbers=False)
    assert loose(["In total she has 5 apples.", "In total she has 6 apples."], "")[0] == 0 == loose(
        ["In total she has 5 apples.", "In total she has 6 apples."], "")[1]


def test_probes_command_trains_a_pair_the_rule_accepts(tmp_path, tiny_checkpoint, monkeypatch):
    from evals.commands import probes as probes_command
    from semverify.cli import main

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": f"{a} + 1 = {a + 1}.\n#### {a + 1}"})
                            + "\n" for a in range(4)))
    out = tmp_path / "probes"
    assert main(["probes", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--data", str(data),
                 "--problems", "4", "--per-answer", "1", "--samples", "3", "--max-step-tokens", "4", "--dtype",
                 "float32", "--folds", "2", "--work", str(tmp_path / "work"), "--out-dir", str(out)]) == 0
    report = json.loads((tmp_path / "work" / "probe_report.json").read_text())
    probe = SemanticProbe.load(report["probes"]["target"], model=str(tiny_checkpoint))
    assert probe.meta["pair"] == report["pair"] and probe.meta["command"].startswith("semverify probes --target ")
    assert report["settings"]["samples"] == 3 and report["prefixes"] > 0

    # a long draw stopped early: train on what is there, without loading the language models
    def no_loading(*args, **kwargs):
        raise AssertionError("--train-only loaded a model")

    monkeypatch.setattr(probes_command, "load_model", no_loading)
    assert main(["probes", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--train-only",
                 "--folds", "2", "--work", str(tmp_path / "work"), "--out-dir", str(out)]) == 0
    again = json.loads((tmp_path / "work" / "probe_report.json").read_text())
    assert again["settings"] == report["settings"] and again["pair"] == report["pair"]  # same data, same pair
    assert again["dtype"] == "float32" and again["problems"] == 4  # how the samples were drawn, not the defaults
