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
