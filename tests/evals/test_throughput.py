"""``semverify throughput``: total tokens/s per batch size, resumable, with the crossover."""

from __future__ import annotations

import json

from evals.throughput import summarise
from semverify.cli import main
from tests.helpers import REPO


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


def test_a_torn_last_row_is_cut_and_run_again(tiny_checkpoint, tmp_path):
    args = ["throughput", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--dtype", "float32",
            "--data", "sample", "--prompts", "2", "--batch-sizes", "1,2", "--max-new-tokens", "4",
            "--methods", "vanilla,pld", "--out", str(tmp_path)]
    assert main(args) == 0
    path = tmp_path / "rows.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:25])  # killed in the middle of the last write
    assert main(args) == 0
    keys = [(r["method"], r["batch_size"], r["first"]) for r in map(json.loads, path.read_text().splitlines())]
    assert len(keys) == len(set(keys)) == 2 * 3 and path.read_text().endswith("\n")


def test_rows_of_earlier_names_are_read_by_the_registrys_names(tiny_checkpoint, tmp_path):
    from evals.throughput import LEGACY

    committed = json.loads((REPO / "results/batch/summary.json").read_text())["summary"]
    rows = [json.loads(line) for line in (REPO / "results/batch/rows.jsonl").open()]
    renamed = summarise(rows, [LEGACY.get(m, m) for m in committed["table"]], committed["sizes"])
    assert list(renamed["table"]) == ["hf_vanilla", "vanilla", "sd", "sd_int8", "pld"]
    for old, by_size in committed["table"].items():
        assert [e["tok_s"] for e in by_size.values()] == [
            e["tok_s"] for e in renamed["table"][LEGACY.get(old, old)].values()]
    assert renamed["crossover"] == committed["crossover"]
    # a folder written with the earlier names resumes under the registry's: nothing is run again
    args = ["throughput", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--dtype", "float32",
            "--data", "sample", "--prompts", "2", "--batch-sizes", "1,2", "--max-new-tokens", "4",
            "--methods", "target_hf,target", "--out", str(tmp_path)]
    assert main(args) == 0
    path = tmp_path / "rows.jsonl"
    earlier = path.read_text().replace('"hf_vanilla"', '"target_hf"').replace('"vanilla"', '"target"')
    path.write_text(earlier)
    assert main(args[:-4] + ["--methods", "hf_vanilla,vanilla", "--out", str(tmp_path)]) == 0
    assert path.read_text() == earlier
