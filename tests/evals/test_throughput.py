"""``semverify throughput``: total tokens/s per batch size, resumable, with the crossover."""

from __future__ import annotations

import json

from evals.throughput import summarise
from semverify.cli import main


def test_throughput_runs_every_method_and_size_and_resumes(tiny_checkpoint, tmp_path, capsys):
    args = ["throughput", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--dtype", "float32",
            "--data", "sample", "--prompts", "4", "--batch-sizes", "1,2", "--max-new-tokens", "6",
            "--methods", "target_hf,target,sd,pld", "--out", str(tmp_path)]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").open()]
    assert len(rows) == 4 * (4 + 2)  # four methods, four batches of one and two of two
    assert main(args) == 0 and len((tmp_path / "rows.jsonl").read_text().splitlines()) == len(rows)
    summary = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert set(summary["crossover"]) == {"sd", "pld"} and summary["table"]["target"]["1"]["vs_target"] == 1.0
    assert (tmp_path / "throughput.png").stat().st_size > 0 and "B=2 tok/s" in capsys.readouterr().out


def test_crossover_is_the_first_size_where_the_target_alone_catches_up():
    rows = [{"method": m, "batch_size": b, "first": 0, "tokens": 100, "wall_s": w}
            for m, b, w in (("target", 1, 10), ("target", 4, 2), ("sd", 1, 5), ("sd", 4, 3))]
    summary = summarise(rows, ["target", "sd"], [1, 4])
    assert summary["table"]["sd"][1]["vs_target"] == 2.0 and summary["crossover"] == {"sd": 4}
