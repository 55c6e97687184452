"""``semverify speed``: every method against the target alone on the same prompts, with where the time goes."""

from __future__ import annotations

import json

from semverify.cli import main


def test_speed_runs_semverifys_drafters_beside_transformers(tiny_checkpoint, tmp_path, capsys):
    methods = "target,hf_assisted,semverify_sd,semverify_tree,semverify_adaptive,semverify_hybrid,semverify_pld"
    assert main(["speed", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--dtype", "float32",
                 "--data", "sample", "--limit", "2", "--max-new-tokens", "12", "--methods", methods,
                 "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    for name in methods.split(",")[2:]:  # fp32 greedy: semverify's lossless drafters write the target's tokens
        assert summary[name]["identical_to_target"] == 2, name
        assert set(summary[name]["time_shares"]) == {"draft", "verify", "other"}
    assert summary["semverify_tree"]["draft_per_step"] > 0 and summary["target"]["draft_per_step"] is None
    assert "draft tokens per step" in capsys.readouterr().out


def test_step_cost_is_the_arithmetic_of_the_speedup():
    from evals.speed import summarise

    target = [{"id": i, "method": "target", "tok_s": 2.0, "wall_s": 5.0, "new_tokens": 10, "tokens": [1], "stats": None}
              for i in (0, 1)]
    # 4 steps of 5 tokens per prompt: each step drafts for 1 s, verifies for 2 s and spends 0.1 s elsewhere
    stats = {"steps": 4, "drafted": 16, "tau": 5.0, "alpha": 1.0, "draft_time": 4.0, "verify_time": 8.0,
             "other_time": 0.4, "total_time": 12.4}
    sd = [{"id": i, "method": "semverify_sd", "tok_s": 20 / 12.4, "wall_s": 12.4, "new_tokens": 20, "tokens": [1],
           "stats": stats} for i in (0, 1)]
    s = summarise(target + sd, ["target", "semverify_sd"])["semverify_sd"]
    assert s["step_cost"] == {"draft": 2.0, "verify": 4.0, "other": 0.2}  # the target takes 0.5 s a token
    assert abs(s["tau"] / sum(s["step_cost"].values()) - s["speedup_vs_target_median"]) < 1e-9


def test_each_semverify_method_is_compared_with_transformers_on_the_same_draft():
    from evals.speed import METHODS, summarise, transformers_counterpart

    assert transformers_counterpart("semverify_tree_q8") == "hf_assisted_q8"
    assert transformers_counterpart("semverify_hybrid") == "hf_assisted"
    assert transformers_counterpart("semverify_pld") == "hf_pld"
    assert transformers_counterpart("hf_assisted") is None and transformers_counterpart("target") is None
    assert all(transformers_counterpart(m) in METHODS for m in METHODS if m.startswith("semverify_"))
    rows = [{"id": 0, "method": m, "tok_s": tok_s, "wall_s": 1.0, "new_tokens": 1, "tokens": [1], "stats": None}
            for m, tok_s in (("target", 1.0), ("hf_assisted_q8", 2.0), ("semverify_tree_q8", 3.0))]
    s = summarise(rows, ["target", "hf_assisted_q8", "semverify_tree_q8"])
    assert s["semverify_tree_q8"]["speedup_vs_hf_assisted_q8_median"] == 1.5
    assert not any(k.startswith("speedup_vs_hf") for k in s["hf_assisted_q8"])
