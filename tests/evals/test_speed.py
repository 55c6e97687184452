"""``semverify speed``: every method against the target alone on the same prompts, with where the time goes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from semverify.cli import main
from semverify.methods import get_method
from tests.helpers import REPO


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


@pytest.mark.parametrize("tear", ["newline", "half"])
def test_a_torn_last_row_is_cut_and_run_again(tiny_checkpoint, tmp_path, tear):
    args = ["speed", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--dtype", "float32",
            "--data", "sample", "--limit", "2", "--max-new-tokens", "6", "--methods", "hf_vanilla,sd",
            "--out", str(tmp_path)]
    assert main(args) == 0
    path = tmp_path / "rows.jsonl"
    lines = path.read_text().splitlines()
    # killed mid-write: the last row complete without its newline, or cut off halfway
    path.write_text("\n".join(lines) if tear == "newline" else "\n".join(lines[:-1]) + "\n" + lines[-1][:30])
    assert main(args) == 0
    keys = [(json.loads(line)["id"], json.loads(line)["method"]) for line in path.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 4 and path.read_text().endswith("\n")


def test_rows_of_earlier_names_are_read_by_the_registrys_names():
    from evals.rows import read_row_file
    from evals.speed import LEGACY, summarise

    committed = json.loads((REPO / "results/speed-drafters/summary.json").read_text())["summary"]
    rows = read_row_file(REPO / "results/speed-drafters/rows.jsonl")
    assert {r["method"] for r in rows} <= set(LEGACY) | {"hf_pld"}  # written before the registry's names
    renamed = summarise(rows, [LEGACY.get(m, m) for m in committed])
    assert list(renamed) == ["hf_vanilla", "hf_sd", "sd", "hf_sd_int8", "sd_int8", "sd_tree_int8", "sd_adaptive_int8",
                             "hybrid_int8", "hf_pld", "pld"]
    for old, s in committed.items():
        new = renamed[LEGACY.get(old, old)]
        assert new["tok_s_median"] == s["tok_s_median"] and new["identical_to_target"] == s["identical_to_target"]
        assert [v for k, v in new.items() if k.startswith("speedup_vs")] == [
            v for k, v in s.items() if k.startswith("speedup_vs")]


def test_the_methods_are_the_registrys_presets_beside_their_transformers_counterparts():
    from evals.speed import METHODS, transformers_counterpart
    from evals.timing import timed_method

    assert transformers_counterpart("sd_tree_int8") == "hf_sd_int8" and transformers_counterpart("hybrid") == "hf_sd"
    assert transformers_counterpart("pld") == "hf_pld" and transformers_counterpart("vanilla") == "hf_vanilla"
    assert all(transformers_counterpart(m) in METHODS for m in METHODS if not m.startswith("hf_"))
    tree = timed_method("sd_tree_int8", k=3)
    assert tree.method == replace(get_method("sd_tree"), k=3) and tree.draft == "int8"
    assert timed_method("pld", k=3, lookup=7).method.k == 7 and timed_method("sd").method == get_method("sd")
    for bad, message in (("hf_sd_tree", "unknown method"), ("pld_int8", "only a preset that drafts"),
                         ("rest", "drafts from a datastore")):
        with pytest.raises(ValueError, match=message):
            timed_method(bad)


def test_the_chosen_draft_lengths_are_shares_of_steps():
    from evals.speed import markdown, summarise

    target = [{"id": 0, "method": "hf_vanilla", "tok_s": 2.0, "wall_s": 4.0, "new_tokens": 8, "tokens": [1],
               "stats": None}]
    stats = {"steps": 4, "drafted": 6, "tau": 2.0, "alpha": 0.5, "draft_time": 1.0, "verify_time": 2.0,
             "other_time": 0.0, "total_time": 3.0, "draft_lengths": [0, 0, 2, 4]}
    planned = [{"id": 0, "method": "sd_auto", "tok_s": 8 / 3.0, "wall_s": 3.0, "new_tokens": 8, "tokens": [1],
                "stats": stats}]
    summary = summarise(target + planned, ["hf_vanilla", "sd_auto"])
    assert summary["sd_auto"]["draft_lengths"] == {0: 0.5, 2: 0.25, 4: 0.25}
    assert summary["hf_vanilla"]["draft_lengths"] is None
    env = {"dtype": "bfloat16", "target": "t", "draft": "d", "max_new_tokens": 8, "date": "2026-12-04",
           "cpu": "cpu", "torch_threads": 2}
    assert "| 0: 50%, 2: 25%, 4: 25% |" in markdown(summary, env)
