"""evals.constructions: old and new coupled rows side by side, rule by rule, on the problems both runs have."""

import json

import pytest

from evals.constructions import markdown, side_by_side


def write_rows(folder, rows):
    folder.mkdir()
    (folder / "rows.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def row(pid, method, correct, tau=4.0, ids=(1, 2)):
    return {"id": pid, "method": method, "sample": 0, "grades": {"math_verify": correct}, "tau": tau,
            "output_ids": list(ids)}


def test_side_by_side_pairs_the_shared_problems_and_reads_the_reference_from_the_old_run(tmp_path):
    old = [row(p, "vanilla", p % 2 == 0) for p in range(4)] + [row(p, "easd", True, 3.0) for p in range(4)]
    new = [row(p, "easd", p < 2, 5.0, ids=(1, 2) if p == 0 else (3,)) for p in range(3)]  # problem 3 not yet run
    write_rows(tmp_path / "old", old)
    write_rows(tmp_path / "new", new)
    result = side_by_side(tmp_path / "old", tmp_path / "new", ["easd"])
    easd = result["methods"]["easd"]
    assert easd["outputs"] == 3 and easd["correct"] == {"old": 3, "new": 2, "reference": 2}
    assert easd["identical"] == 1 and easd["tau"] == {"old": 3.0, "new": 5.0}
    assert easd["new - old"]["difference"] == pytest.approx(-1 / 3) and easd["new - old"]["discordant"] == 1
    assert easd["new - reference"]["discordant"] == 2
    assert "| `easd` | 0-2 (3) | 3 / 2 (2) |" in markdown(result)
    with pytest.raises(ValueError, match="'mars' has no rows in"):
        side_by_side(tmp_path / "old", tmp_path / "new", ["mars"])


def test_a_rule_the_old_run_never_ran_is_measured_against_the_reference_only(tmp_path):
    write_rows(tmp_path / "old", [row(p, "vanilla", p == 0) for p in range(3)])
    write_rows(tmp_path / "new", [row(p, "mars", True, 5.0) for p in range(2)])
    mars = side_by_side(tmp_path / "old", tmp_path / "new", ["mars"])["methods"]["mars"]
    assert mars["old_rows"] is False and mars["outputs"] == 2
    assert mars["correct"] == {"old": None, "new": 2, "reference": 1}
    assert mars["new - old"] is None and mars["old - reference"] is None
    assert mars["new - reference"]["difference"] == pytest.approx(0.5) and mars["identical"] is None
    table = markdown(side_by_side(tmp_path / "old", tmp_path / "new", ["mars"]))
    assert "| `mars` | 0-1 (2) | - / 2 (1) | - (no old rows) | - (no old rows) |" in table
    assert "measured against the reference only" in table
