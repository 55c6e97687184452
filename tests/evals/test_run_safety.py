"""Runs that cannot lose or mix rows: settings checked on every shard, files pinned by content, the torn
line cut before the done-set is read, one writer per shard, broken lines reported, machines compared."""

from __future__ import annotations

import json

import pytest

from evals.rows import RowWriter, read_rows
from evals.summary import summarise
from semverify.cli import main
from semverify.methods import get_method
from tests.helpers import REPO, run_row  # noqa: F401  (REPO: the harness runs from the repository)


def args(checkpoint, out, data="sample", limit=2, extra=()):
    return ["compare", "--target", str(checkpoint), "--draft", str(checkpoint), "--methods", "vanilla,pld",
            "--data", str(data), "--limit", str(limit), "--max-new-tokens", "8", "--dtype", "float32",
            "--out", str(out), "--no-report", *extra]


def test_every_shard_checks_the_settings(tiny_checkpoint, tmp_path, monkeypatch):
    main(args(tiny_checkpoint, tmp_path / "run"))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match="other settings"):  # rank 1 of a resume with another seed
        main(args(tiny_checkpoint, tmp_path / "run", extra=["--seed", "3"]))


def test_a_data_file_that_changed_is_refused(tiny_checkpoint, tmp_path):
    data = tmp_path / "dev.jsonl"
    rows = [{"question": f"What is {a} + 1?", "answer": f"#### {a + 1}"} for a in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(args(tiny_checkpoint, tmp_path / "run", data, limit=2))
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert list(run["pins"]["data"]) == [str(data)]
    rows[0]["answer"] = "#### 7"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit, match=f"{data} \\(the data\\) changed since this run started"):
        main(args(tiny_checkpoint, tmp_path / "run", data, limit=2))


def test_a_resume_with_other_code_says_so(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    main(args(tiny_checkpoint, tmp_path / "run", limit=1))
    monkeypatch.setattr("evals.provenance.code_version", lambda: "other-code")
    main(args(tiny_checkpoint, tmp_path / "run", limit=1))
    assert "with code other-code" in capsys.readouterr().err


def test_a_complete_row_without_its_newline_is_not_lost(tiny_checkpoint, tmp_path):
    out = tmp_path / "run"
    main(args(tiny_checkpoint, out))
    path = out / "rows.rank0.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines))  # the last row complete, its newline never written
    main(args(tiny_checkpoint, out))
    keys = [(json.loads(line)["id"], json.loads(line)["method"]) for line in path.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 4  # the cut row was run again, not counted as done and then cut


def test_two_runs_cannot_write_one_folder(tiny_checkpoint, tmp_path):
    out = tmp_path / "run"
    with RowWriter(out / "rows.rank0.jsonl"):
        with pytest.raises(SystemExit, match="another run is writing"):
            main(args(tiny_checkpoint, out))
    main(args(tiny_checkpoint, out))  # the lock went with the first writer


def test_a_broken_line_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "rows.rank0.jsonl"
    path.write_text('{"id": 0, "method": "a"}\n{"id": 1, "meth\n{"id": 2, "method": "a"}\n')
    with pytest.raises(ValueError, match="rows.rank0.jsonl, line 2: a broken row"):
        read_rows(tmp_path)
    path.write_text('{"id": 0, "method": "a"}\n{"id": 1, "meth')  # a torn last line is only skipped
    assert [r["id"] for r in read_rows(tmp_path)] == [0]


@pytest.mark.parametrize("resumed, timed", [([], 2), ([{"cpu": "c"}], 2), ([{"cpu": "other"}], 0)])
def test_rows_without_a_machine_are_timed_only_in_a_run_that_never_moved(tmp_path, resumed, timed):
    settings = {"target": "t", "draft": "d", "dtype": "float32", "benchmark": "gsm8k", "data": "sample",
                "template": "chat", "max_new_tokens": 8, "do_sample": False, "temperature": 1.0, "top_k": None,
                "top_p": None, "seed": 0}
    (tmp_path / "run.json").write_text(json.dumps({
        "settings": settings, "environment": {"cpu": "c"}, "resumed": resumed,
        "methods": [get_method("vanilla").to_dict(), get_method("pld").to_dict()]}))
    with RowWriter(tmp_path / "rows.rank0.jsonl") as writer:
        for i in range(2):
            writer.write(run_row(i, "vanilla", 4.0))  # rows written before they recorded their machine
            writer.write(run_row(i, "pld", 8.0))
    pld = summarise(tmp_path)["methods"]["pld"]
    assert pld["speedup_problems"] == timed and pld["speedup_median"] == (2.0 if timed else 0.0)


def test_a_rebuilt_store_is_refused_unless_repinned_and_then_recorded(tmp_path):
    from evals.provenance import RunSettings, prepare_run

    settings, methods = RunSettings(target="t", draft="d"), [get_method("vanilla")]
    pins = lambda store, data="aa": {"data": {"dev.jsonl": data}, "methods": {"vanilla": {"ds.pt": store}}}  # noqa: E731
    prepare_run(tmp_path, settings, methods, pins("11"), {"vanilla"})
    with pytest.raises(ValueError, match=r"ds.pt \(method 'vanilla'\) changed .* pass --repin"):
        prepare_run(tmp_path, settings, methods, pins("22"), {"vanilla"})
    with pytest.raises(ValueError, match=r"dev.jsonl \(the data\) changed"):  # never for the problems themselves
        prepare_run(tmp_path, settings, methods, pins("22", data="bb"), {"vanilla"}, repin=True)
    prepare_run(tmp_path, settings, methods, pins("22"), {"vanilla"}, repin=True)
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["pins"]["methods"]["vanilla"] == {"ds.pt": "22"}
    (record,) = run["repinned"]
    assert record["files"] == [{"file": "ds.pt", "for": "method 'vanilla'", "then": "11", "now": "22"}]
    prepare_run(tmp_path, settings, methods, pins("22"), {"vanilla"})  # the new file is the pin from now on


def test_coupled_rows_of_the_old_construction_are_never_resumed_under_the_new_one(tmp_path):
    """A coupled run started under coupling 1 (no "coupling" in its settings) is refused under coupling 2 with one
    line that says why and what to do; an uncoupled run is not concerned."""
    from evals.provenance import RunSettings, prepare_run

    methods, pins = [get_method("vanilla")], {"data": {}, "methods": {}}
    for name in ("coupled", "fresh", "greedy"):
        (tmp_path / name).mkdir()
    old = RunSettings(target="t", draft="d", do_sample=True, coupled=True)
    prepare_run(tmp_path / "coupled", old, methods, pins, {"vanilla"})
    run = json.loads((tmp_path / "coupled" / "run.json").read_text())
    del run["settings"]["coupling"]  # as the runs before coupling 2 recorded it
    (tmp_path / "coupled" / "run.json").write_text(json.dumps(run))
    new = RunSettings(target="t", draft="d", do_sample=True, coupled=True, coupling=2)
    with pytest.raises(ValueError, match=r"coupled rows drawn under coupling 1 .* never pooled.* new --out"):
        prepare_run(tmp_path / "coupled", new, methods, pins, {"vanilla"})
    prepare_run(tmp_path / "fresh", new, methods, pins, {"vanilla"})
    prepare_run(tmp_path / "fresh", new, methods, pins, {"vanilla"})  # the same construction resumes
    greedy = RunSettings(target="t", draft="d")
    prepare_run(tmp_path / "greedy", greedy, methods, pins, {"vanilla"})
    prepare_run(tmp_path / "greedy", greedy, methods, pins, {"vanilla"})
