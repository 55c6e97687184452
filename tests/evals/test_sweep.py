"""``semverify sweep``: a grid of one method's settings on the same problems, its frontier and pick."""

from __future__ import annotations

import json

import pytest

from evals.sweep import grid_methods, parse_grid
from semverify.cli import main


def test_grids_expand_to_method_strings():
    grids = parse_grid(["min_mean_logprob=-0.5,-1", "veto_top_k=3"])
    assert grids == {"min_mean_logprob": [-0.5, -1], "veto_top_k": [3]}
    assert grid_methods("step_likelihood", grids) == ["step_likelihood:min_mean_logprob=-0.5,veto_top_k=3",
                                                      "step_likelihood:min_mean_logprob=-1,veto_top_k=3"]
    with pytest.raises(ValueError, match="KEY=V1,V2"):
        parse_grid(["r_min"])


def test_sweep_runs_the_grid_beside_the_references_and_picks(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--method", "typical", "--grid", "posterior_threshold=0.05,1.0",
                 "--grid", "posterior_alpha=inf", "--references", "vanilla,sd", "--keep", "1.0",
                 "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--data", "sample",
                 "--offset", "2", "--limit", "2", "--max-new-tokens", "8", "--dtype", "float32",
                 "--out", str(out)]) == 0
    result = json.loads((out / "sweep.json").read_text())
    assert [r["method"] for r in result["rows"]] == [
        "vanilla", "sd", "typical:posterior_threshold=0.05,posterior_alpha=inf",
        "typical:posterior_threshold=1.0,posterior_alpha=inf"]
    rows = [json.loads(line) for line in (out / "rows.rank0.jsonl").open()]
    assert sorted({r["id"] for r in rows}) == [2, 3]  # the problems after the offset
    # at threshold 1 with alpha inf typical acceptance is exact greedy matching: it keeps vanilla's accuracy
    assert result["pick"] is not None and (out / "sweep.png").stat().st_size > 0
    assert "Pick: `typical:" in capsys.readouterr().out
    # --report-only writes the frontier from the rows there, running nothing (the rows stay as they are)
    (out / "sweep.md").unlink()
    before = (out / "rows.rank0.jsonl").read_text()
    assert main(["sweep", "--method", "typical", "--grid", "posterior_threshold=0.05,1.0", "--grid",
                 "posterior_alpha=inf", "--references", "vanilla,sd", "--report-only", "--out", str(out)]) == 0
    assert (out / "sweep.md").exists() and (out / "rows.rank0.jsonl").read_text() == before
    with pytest.raises(SystemExit, match="holds no run yet"):
        main(["sweep", "--method", "typical", "--grid", "k=2", "--report-only", "--out", str(tmp_path / "none")])
