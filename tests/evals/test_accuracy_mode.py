"""Accuracy mode: the batch size is chosen once from measurements that fit in memory and kept by every resume,
rows are untimed, a timed pass at batch 1 gives the speedups, and runs grow samples without losing rows."""

from __future__ import annotations

import json

import pytest

import evals.accuracy
from evals.accuracy import fitting
from evals.rows import read_rows
from semverify.cli import main
from tests.evals.test_compare import compare_args

RATES = {1: 10.0, 4: 30.0, 8: 50.0, 16: 52.0, 32: 80.0, 64: 90.0}  # 16 gains under 10% on 8: the search stops there


def fake_rates(measured: list[int]):
    def rate(model, prompts, pad, new=16):
        measured.append(len(prompts))
        return RATES[len(prompts)]

    return rate


def refuse(*args, **kwargs):
    raise AssertionError("measured again")


def accuracy_args(checkpoint, out, extra=(), limit=4):
    return compare_args(checkpoint, out, limit=limit, extra=["--accuracy", "--no-report", *extra])


def test_the_batch_size_is_measured_once_recorded_and_kept_by_every_resume(tiny_checkpoint, tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(evals.accuracy, "decode_rate", fake_rates(measured))
    monkeypatch.setattr(evals.accuracy, "available_memory", lambda device: 1 << 40)
    out, one_method = tmp_path / "run", ["--methods", "vanilla"]
    assert main(accuracy_args(tiny_checkpoint, out, one_method, limit=20)) == 0
    assert measured == [1, 4, 8, 16]  # 20 (the run's outputs) would come next
    run = json.loads((out / "run.json").read_text())
    assert run["accuracy"]["batch_size"] == 16 and run["settings"]["batch_size"] == 16  # the fastest measured
    assert run["accuracy"]["measured_tok_s"] == {"1": 10.0, "4": 30.0, "8": 50.0, "16": 52.0}
    assert run["accuracy"]["dtype"] == "float32"
    assert ("the most total tokens/s of the target alone in float32 (batch size: tokens/s 1: 10.0, 4: 30.0, 8: 50.0, "
            "16: 52.0)") == run["accuracy"]["why"]
    rows = read_rows(out)
    assert len(rows) == 20 and all(r["timed"] is False for r in rows)
    assert sorted(r["batch"]["size"] for r in rows[::4]) == [4, 16, 16, 16, 16]
    monkeypatch.setattr(evals.accuracy, "decode_rate", refuse)
    shard = out / "rows.rank0.jsonl"
    shard.write_text("".join(shard.read_text().splitlines(keepends=True)[:5]))  # killed after five rows
    assert main(accuracy_args(tiny_checkpoint, out, one_method, limit=20)) == 0
    assert len(read_rows(out)) == 20 and json.loads((out / "run.json").read_text())["accuracy"] == run["accuracy"]
    with pytest.raises(SystemExit, match="this run decodes batches of 16"):  # another size would change the run
        main(accuracy_args(tiny_checkpoint, out, [*one_method, "--batch-size", "2"], limit=20))


def test_sizes_never_exceed_the_runs_outputs(tiny_checkpoint, tmp_path, monkeypatch):
    measured = []
    monkeypatch.setattr(evals.accuracy, "decode_rate", fake_rates(measured))
    monkeypatch.setattr(evals.accuracy, "available_memory", lambda device: 1 << 40)
    main(accuracy_args(tiny_checkpoint, tmp_path / "run", ["--methods", "vanilla"], limit=4))
    assert measured == [1, 4] and json.loads((tmp_path / "run" / "run.json").read_text())["accuracy"]["batch_size"] == 4


def test_memory_caps_the_sizes_measured(tiny_checkpoint, tmp_path, monkeypatch):
    assert fitting((1, 4, 8, 16), row_bytes=100, free=1000) == [1, 4]  # 8 rows need 800 bytes, over 75% of 1000
    assert fitting((1, 4), row_bytes=10_000, free=1000) == [1]  # one row is always tried
    measured = []
    monkeypatch.setattr(evals.accuracy, "decode_rate", fake_rates(measured))
    row_bytes = []
    real_fitting = evals.accuracy.fitting
    monkeypatch.setattr(evals.accuracy, "fitting", lambda c, b, f: row_bytes.append(b) or real_fitting(c, b, f))
    monkeypatch.setattr(evals.accuracy, "available_memory", lambda device: 0)
    out = tmp_path / "run"
    main(accuracy_args(tiny_checkpoint, out))
    choice = json.loads((out / "run.json").read_text())["accuracy"]
    assert measured == [1] and choice["batch_size"] == 1
    assert choice["why"].endswith(f"; 4 would not fit in memory (0.0 GiB free, {row_bytes[0] / 2**20:.0f} MiB a row)")
    assert row_bytes[0] > 0 and choice["row_bytes"] == row_bytes[0]
    assert json.loads((out / "run.json").read_text())["settings"]["batch_size"] is None  # one at a time


def test_a_given_batch_size_is_not_measured_and_float32_is_the_default(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(evals.accuracy, "decode_rate", refuse)
    out = tmp_path / "run"
    args = accuracy_args(tiny_checkpoint, out, ["--batch-size", "2"])
    dtype = args.index("--dtype")
    assert main(args[:dtype] + args[dtype + 2 :]) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["accuracy"] == {"batch_size": 2, "dtype": "float32", "why": "given with --batch-size"}
    assert run["settings"]["dtype"] == "float32" and run["settings"]["batch_size"] == 2


def test_a_plain_batched_run_resumes_in_accuracy_mode(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(evals.accuracy, "decode_rate", refuse)
    out = tmp_path / "run"
    assert main(compare_args(tiny_checkpoint, out, limit=2, extra=["--batch-size", "2", "--no-report"])) == 0
    assert "accuracy" not in json.loads((out / "run.json").read_text())
    with pytest.raises(SystemExit, match="other settings"):  # --limit is a setting: same run, same problems
        main(accuracy_args(tiny_checkpoint, out, ["--batch-size", "2"], limit=3))
    assert main(accuracy_args(tiny_checkpoint, out, ["--batch-size", "2"], limit=2)) == 0
    assert json.loads((out / "run.json").read_text())["accuracy"]["why"] == "the batch size the run started with"
    assert main(accuracy_args(tiny_checkpoint, out, limit=2)) == 0  # no --batch-size: the run's own, unmeasured


def test_the_timed_pass_gives_the_speedups_and_the_report_labels_both(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(evals.accuracy, "decode_rate", refuse)
    out = tmp_path / "run"
    assert main(accuracy_args(tiny_checkpoint, out, ["--batch-size", "2"])) == 0
    from evals.report import report

    untimed = report(out)
    assert "accuracy mode: accuracy over 4 problems x 1 sample(s) (float32, batches of 2: given with --batch-size)" \
        in untimed and "no speed (untimed rows" in untimed
    assert main(accuracy_args(tiny_checkpoint, out, ["--batch-size", "2", "--timed", "2", "--timed-dtype",
                                                     "float32"])) == 0
    timed = json.loads((out / "timed" / "run.json").read_text())
    assert timed["settings"]["limit"] == 2 and timed["settings"]["batch_size"] is None
    timed_rows = read_rows(out / "timed")
    assert len(timed_rows) == 8 and all("timed" not in r and "batch" not in r for r in timed_rows)
    text = report(out)
    assert "speed over the 2 problems of its timed pass (`timed/`, one at a time, float32)" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == 4 and summary["methods"]["sd"]["speedup_problems"] == 2
    assert summary["methods"]["vanilla"]["speedup"] == pytest.approx(1.0)
    # problems per hour of each pass over the 2 timed problems: they shared one batch of 2 in the accuracy pass
    batched = [r for r in read_rows(out) if r["method"] == "sd" and r["id"] in (0, 1)]
    assert len({json.dumps(r["batch"]) for r in batched}) == 1 and batched[0]["batch"]["size"] == 2
    alone = sum(r["total_time"] for r in timed_rows if r["method"] == "sd" and r["id"] in (0, 1))
    gain = summary["timed"]["throughput"]["sd"]
    assert gain["problems"] == 2 and gain["accuracy_per_hour"] == pytest.approx(2 * 3600 / batched[0]["batch"]["wall"])
    assert gain["timed_per_hour"] == pytest.approx(2 * 3600 / alone)
    assert f"| sd | 2 | {gain['accuracy_per_hour']:.1f} | {gain['timed_per_hour']:.1f} | {gain['gain']:.1f}x |" in text


def test_accuracy_mode_refuses_what_cannot_batch_and_timed_needs_it(tiny_checkpoint, tmp_path):
    with pytest.raises(SystemExit, match="--accuracy"):
        main(compare_args(tiny_checkpoint, tmp_path / "a", extra=["--timed", "2"]))
    with pytest.raises(SystemExit, match="specreason decode one problem at a time; run them without --accuracy"):
        main(accuracy_args(tiny_checkpoint, tmp_path / "b", ["--methods", "vanilla,specreason"]))


def test_samples_grow_on_resume_and_the_first_samples_keep_their_rows(tiny_checkpoint, tmp_path):
    out = tmp_path / "run"
    sampled = ["--do-sample", "--coupled", "--no-report", "--batch-size", "2"]
    assert main(compare_args(tiny_checkpoint, out, limit=2, extra=sampled)) == 0
    first = {(r["id"], r["method"], r.get("sample", 0)): r["output_ids"] for r in read_rows(out)}
    assert main(compare_args(tiny_checkpoint, out, limit=2, extra=[*sampled, "--samples", "2"])) == 0
    rows = {(r["id"], r["method"], r.get("sample", 0)): r["output_ids"] for r in read_rows(out)}
    assert len(rows) == 2 * len(first) and all(rows[key] == ids for key, ids in first.items())
    run = json.loads((out / "run.json").read_text())
    assert run["settings"]["samples"] == 2 and run["samples_grown"][0]["samples"] == 2
    with pytest.raises(SystemExit, match="other settings"):  # fewer samples than the run has: refused
        main(compare_args(tiny_checkpoint, out, limit=2, extra=[*sampled, "--samples", "1"]))


def test_machine_time_counts_each_batch_once_and_projects_the_rest_of_the_run(tmp_path):
    from evals.report import _machine_time
    from evals.summary import machine_time

    def row(pid, method, tokens, first, wall, batch_tokens):
        return {"id": pid, "method": method, "sample": 0, "new_tokens": tokens,
                "batch": {"first": first, "size": 2, "wall": wall, "tokens": batch_tokens}}

    rows = [row(0, "a", 60, 0, 360.0, 100), row(1, "a", 40, 0, 360.0, 100),  # one batch of 0.1 h
            row(2, "a", 10, 2, 720.0, 30), row(3, "a", 20, 2, 720.0, 30)]  # one of 0.2 h
    (tmp_path / "rows.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = {"settings": {"limit": 10, "samples": 2}, "environment": {"cpu": "CPU X"}}
    times = machine_time(tmp_path, run, ["a", "b"])
    assert times["a"]["outputs"] == 4 and times["a"]["hours"] == pytest.approx(0.3)
    assert times["a"]["per_hour"] == pytest.approx(4 / 0.3) and times["a"]["left"] == 16  # 10 problems x 2 samples
    assert times["a"]["hours_left"] == pytest.approx(1.2)
    assert times["b"] == {"outputs": 0, "hours": 0.0, "per_hour": None, "left": 20, "hours_left": None}
    text = "\n".join(_machine_time({"run": run, "machine_time": times}))
    assert "to reach 10 x 2 outputs at the same pace" in text
    assert "| a | 4 | 0.30 | 13.3 | 16 | 1.20 |" in text and "| b | 0 | 0.00 | - | 20 | - |" in text
    assert "| all | 4 | 0.30 | - | 36 | - |" in text  # no total while a method has no pace yet
