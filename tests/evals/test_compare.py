"""semverify compare/report: resumable rows, sharding, clear errors before any model loads."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from evals.benchmarks import get_benchmark
from evals.report import parse_spans, report, spans
from evals.rows import RowWriter, read_rows
from evals.summary import machine_timing, mcnemar, summarise, wilson
from semverify.cli import main
from semverify.machine import machine
from semverify.methods import Method, get_method, load_methods, parse_method
from semverify.registry import RunContext
from tests.helpers import REPO, byte_tokenizer, run_row, tiny_model

METHODS = "vanilla,sd,pld,typical"


def compare_args(checkpoint, out, limit=4, extra=()):
    return ["compare", "--target", str(checkpoint), "--draft", str(checkpoint), "--methods", METHODS,
            "--data", "sample", "--limit", str(limit), "--max-new-tokens", "24", "--dtype", "float32",
            "--out", str(out), *extra]


def comparable(rows):
    """Rows without timings, keyed by (problem, method), for comparing runs."""
    drop = {"draft_time", "verify_time", "total_time", "tok_s"}
    return {(r["id"], r["method"]): {k: v for k, v in r.items() if k not in drop} for r in rows}


def test_method_parsing_and_errors():
    assert parse_method("sd") == get_method("sd")
    m = parse_method("typical:posterior_threshold=0.2,k=3")
    assert m.k == 3 and m.rule_params == {"posterior_threshold": 0.2} and not m.lossless()
    assert [x.name for x in load_methods("vanilla,typical:posterior_threshold=0.2,k=3,pld")] == [
        "vanilla", "typical:posterior_threshold=0.2,k=3", "pld"]
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        parse_method("nope")
    with pytest.raises(ValueError, match="unknown acceptance rule"):
        Method("x", "model", "no-such-rule").checked(None)
    with pytest.raises(ValueError, match="expected key=value"):
        parse_method("typical:0.2")
    with pytest.raises(ValueError, match="method names must be unique"):
        load_methods("sd,sd")


def test_method_configs_combine_in_order():
    configs = [REPO / "evals/configs/gsm8k-sense.json", REPO / "evals/configs/gsm8k-sense-id.json"]
    methods = load_methods("vanilla", configs[1:])
    assert [m.name for m in methods] == ["vanilla", "rest_id", "sense_id"]
    names = [m.name for m in load_methods(None, configs)]
    assert names[:6] == ["vanilla", "pld", "rest", "sense_no_sen", "sense_no_se", "sense"] and names[6:] == [
        "rest_id", "sense_id"]
    assert load_methods(None, str(configs[1])) == methods[1:]  # one path alone, as a string


@pytest.mark.parametrize("config", sorted((REPO / "evals/configs").glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_says_where_its_settings_come_from(config):
    context = RunContext.for_decoding("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct", True, 0.7,
                                      byte_tokenizer())  # a phase's text markers are tokenized with the run's
    methods = load_methods(None, [config], context)  # rules built as a run on the default pair builds them
    assert methods and len({m.name for m in methods}) == len(methods)
    assert json.loads(config.read_text()).get("about"), f"{config.name} needs an 'about': what it is for, and why"


def test_only_picks_named_methods_from_the_configs():
    configs = [REPO / "evals/configs/gsm8k-sense.json", REPO / "evals/configs/gsm8k-sense-id.json"]
    everything = {m.name: m for m in load_methods(None, configs)}
    picked = load_methods("sd", configs, only="sense_id, vanilla,rest_id,vanilla")
    assert picked == [everything["sense_id"], everything["vanilla"], everything["rest_id"]]
    with pytest.raises(ValueError, match="--only names nope, sdd; the methods given are sd, vanilla, pld"):
        load_methods("sd", configs, only="sd,nope,sdd")
    with pytest.raises(ValueError, match="--only names no method"):
        load_methods("sd", only=" , ")


def test_only_keeps_commas_inside_a_methods_parameters():
    named = "typical:posterior_threshold=0.2,posterior_alpha=0.1"
    picked = load_methods(f"sd,{named}", only=named)
    assert [m.name for m in picked] == [named]


def test_drafter_settings_are_checked_against_the_drafter_kind():
    m = parse_method("sense:drafter.max_nodes=24,drafter.num_candidates=4,theta_e=0.1")
    assert m.drafter_params == {"max_nodes": 24, "num_candidates": 4} and m.rule_params == {"theta_e": 0.1}
    assert m.to_dict()["drafter_params"] == m.drafter_params and "drafter_params" not in get_method("sd").to_dict()
    with pytest.raises(ValueError, match="unknown drafter settings nodes"):
        parse_method("sense:drafter.nodes=3")
    with pytest.raises(ValueError, match="known: .*max_nodes"):
        parse_method("rest:drafter.semantic=true")  # REST's switch is fixed by the method
    with pytest.raises(ValueError, match="unknown drafter settings max_nodes; known: adaptive"):
        parse_method("sd:drafter.max_nodes=3")
    with pytest.raises(ValueError, match="unknown drafter settings max_nodes; known: prefer"):
        parse_method("pld:drafter.max_nodes=3")


def test_rule_the_drafter_cannot_serve_is_refused(monkeypatch):
    from semverify import registry
    from semverify.registry import register_rule
    from semverify.rules import SpeculativeSampling

    monkeypatch.setattr(registry._RULES, "entries", dict(registry._RULES.entries))  # the rule dies with the test
    class NeedsProbs(SpeculativeSampling):
        name = "needs-probs-test"
        needs_draft_probs = True

    register_rule("needs-probs-test", NeedsProbs)
    with pytest.raises(ValueError, match="needs draft probabilities.*prompt_lookup"):
        Method("bad", "prompt_lookup", "needs-probs-test").checked(None)


def test_fly_with_drafts_shorter_than_its_window_is_refused():
    """FLy rescues a mismatch only where a whole window of drafted tokens follows: at k < window it never
    departs from exact matching, silently (as the first fly_model rows of results/gsm8k-500 did). SENSE's
    top-k rescue works at any k, so SENSE is not refused."""
    with pytest.raises(ValueError, match="fly.*at least 6 tokens.*k=5"):
        Method("fly_short", "model", "fly", k=5).checked(None)
    with pytest.raises(ValueError, match="at least 4 tokens"):
        Method("fly_short_window", "model", "fly", {"window": 4}, k=3).checked(None)
    assert Method("fly_k6", "model", "fly", k=6).checked(None).k == 6
    assert Method("fly_no_window", "model", "fly", {"window": 0}, k=3).checked(None).k == 3
    assert Method("sense_short", "rest", "sense", k=3).checked(None).k == 3


@pytest.mark.parametrize("args, message", [
    (["--methods", "vanilla,bogus"], "unknown method 'bogus'"),
    (["--data", "/no/such/file.jsonl"], "GSM8K data file not found"),
    (["--benchmark", "mmlu"], "unknown benchmark 'mmlu'"),
])
def test_input_errors_come_before_model_loading(tmp_path, capsys, args, message):
    # the target does not exist: reaching model loading would raise a different error
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--target", "/no/such/model", "--out", str(tmp_path / "run"), *args])
    assert message in str(exit_info.value)


def test_torn_last_line_is_dropped_and_duplicates_ignored(tmp_path):
    path = tmp_path / "rows.rank0.jsonl"
    path.write_text(json.dumps({"id": 0, "method": "a"}) + "\n" + '{"id": 1, "meth')
    assert [r["id"] for r in read_rows(tmp_path)] == [0]
    writer = RowWriter(path)
    writer.write({"id": 1, "method": "a"})
    writer.write({"id": 0, "method": "a", "again": True})
    writer.close()
    rows = read_rows(tmp_path)
    assert sorted(r["id"] for r in rows) == [0, 1] and not any(r.get("again") for r in rows)


def test_statistics_helpers():
    lo, hi = wilson(0, 10)
    assert lo == 0 and 0.27 < hi < 0.29
    assert wilson(10, 10)[1] == 1.0
    result = mcnemar([True] * 10 + [False] * 10, [True] * 10 + [True] * 10)
    assert result["only_method"] == 10 and result["only_reference"] == 0 and result["p_value"] < 0.01


def test_per_step_scores_are_summarised_by_quantiles():
    from evals.report import _rule_events
    from evals.summary import _score_summary

    rows = [{"scores": {"step_ratio": [0.5, 1.5, 2.0]}}, {"scores": {"step_ratio": [1.2]}}, {"scores": {}}]
    q = _score_summary(rows)["step_ratio"]
    assert q["n"] == 4 and q["min"] == 0.5 and q["max"] == 2.0 and q["share_below_1"] == 0.25
    assert q["median"] == 1.35 and q["p10"] < q["median"] < q["p90"]
    line = _rule_events({"methods": {"ss": {"reasons": {}, "scores": {"step_ratio": q}}}})[-1]
    assert line.startswith("- `ss` step_ratio over 4 steps: min 0.5,") and line.endswith("25.0% below 1")
    flags = _score_summary([{"scores": {"step_accepted": [1.0, 0.0, 1.0]}}, {"scores": {"step_accepted": [1.0]}}])
    line = _rule_events({"methods": {"ss": {"reasons": {}, "scores": flags}}})[-1]
    assert line == "- `ss` step_accepted: 3 of 4 steps (75.0%)"
    judged = _score_summary([{"scores": {"judge_score": [5.5, 6.5]}}])
    line = _rule_events({"methods": {"sr": {"reasons": {}, "scores": judged}}})[-1]
    assert line.endswith("max 6.5")  # a share below 1 means something for ratios only


def test_compare_report_and_resume_after_kill(tiny_checkpoint, tmp_path):
    clean = tmp_path / "clean"
    main(compare_args(tiny_checkpoint, clean))
    expected = comparable(read_rows(clean))
    assert len(expected) == 4 * 4
    assert {r["machine"] for r in read_rows(clean)} == {machine()}  # timings are compared within one machine
    text = (clean / "report.md").read_text()
    assert "| vanilla | yes |" in text and "| typical | no |" in text
    assert f"target `{tiny_checkpoint}`, draft `{tiny_checkpoint}`, float32, greedy" in text
    assert (clean / "accuracy_vs_speedup.png").stat().st_size > 0
    assert (clean / "acceptance_by_position.png").stat().st_size > 0
    assert (clean / "running_difference.png").stat().st_size > 0
    assert (clean / "difference_vs_tau.png").stat().st_size > 0
    summary = json.loads((clean / "summary.json").read_text())
    assert len(summary["methods"]["typical"]["paired"]["vanilla"]["difference"]["per_problem"]) == 4
    assert summary["methods"]["sd"]["accuracy"]["strict"]["n"] == 4
    # fp32, target as its own draft: the lossless methods write the target's text, which the report says
    assert summary["methods"]["sd"]["paired"]["vanilla"]["identical"] == 4
    assert "`sd` = `vanilla` on 4 of 4" in text

    crashed = tmp_path / "crashed"
    cmd = [sys.executable, "-m", "semverify.cli", *compare_args(tiny_checkpoint, crashed, extra=["--no-report"])]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows_file = crashed / "rows.rank0.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (rows_file.exists() and rows_file.read_text().count("\n") >= 3):
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before the kill landed: the resume below would test nothing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= rows_file.read_text().count("\n") < 16  # killed mid-run
    with rows_file.open("a") as f:  # as if the kill had landed in the middle of a write
        f.write('{"id": 3, "method": "sd", "out')
    main(compare_args(tiny_checkpoint, crashed))
    assert comparable(read_rows(crashed)) == expected
    lines = [line for line in rows_file.read_text().splitlines() if line.startswith("{")]
    keys = [(json.loads(line)["id"], json.loads(line)["method"]) for line in lines if line.endswith("}")]
    assert len(keys) == len(set(keys)) == 16
    spec = json.loads((crashed / "run.json").read_text())  # the resume is on record, with the code that ran
    assert len(spec["resumed"]) == 1 and re.fullmatch(r"[0-9a-f]{40}( \+ local changes)?", spec["resumed"][0]["code"])


def test_ctrl_c_stops_a_compare_with_one_line_and_exit_130(tiny_checkpoint, tmp_path):
    """Ctrl-C (SIGINT) on a real `compare`: no traceback, exit status 130, one line saying how many rows were kept
    and how to resume, and the rerun goes on from them."""
    out = tmp_path / "stopped"
    cmd = [sys.executable, "-m", "semverify.cli", *compare_args(tiny_checkpoint, out, extra=["--no-report"])]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows_file = out / "rows.rank0.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (rows_file.exists() and rows_file.read_text().count("\n") >= 2):
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before the interrupt landed"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    last = re.split(r"[\r\n]", err.strip())[-1]  # below the progress bar
    kept = len(read_rows(out))
    assert last == f"semverify compare: stopped; {kept} rows kept in {out}; rerun the same command to resume"
    assert 2 <= kept < 16
    main(compare_args(tiny_checkpoint, out, extra=["--no-report"]))
    assert len(read_rows(out)) == 16


def test_compare_builds_the_benchmark_tokenizer_and_rules_once(tiny_checkpoint, tmp_path, monkeypatch):
    from collections import Counter

    from evals import runner
    from evals.benchmarks import Benchmark
    from semverify import models

    built = Counter()

    def count(owner, name, what):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            built[what(*args)] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)

    count(Benchmark, "load", lambda *_: "benchmark")
    for owner in (models, runner):  # the harness reads the target's tokenizer with load_tokenizer
        count(owner, "load_tokenizer", lambda *_: "tokenizer")
    count(Method, "build_rule", lambda method, *_: f"rule {method.name}")
    assert main(compare_args(tiny_checkpoint, tmp_path / "run", limit=1, extra=["--no-report"])) == 0
    assert len(read_rows(tmp_path / "run")) == 4
    # each rule once: the check builds it and the run keeps it
    assert built == {"benchmark": 1, "tokenizer": 1, **{f"rule {m}": 1 for m in METHODS.split(",")}}


def test_resume_with_other_settings_is_refused(tiny_checkpoint, tmp_path):
    main(compare_args(tiny_checkpoint, tmp_path / "run", limit=1, extra=["--no-report"]))
    with pytest.raises(SystemExit, match="other settings"):
        main(compare_args(tiny_checkpoint, tmp_path / "run", limit=2))


def test_methods_can_be_added_to_an_existing_run(tiny_checkpoint, tmp_path):
    run = tmp_path / "run"
    args = ["compare", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--data", "sample",
            "--limit", "2", "--max-new-tokens", "8", "--dtype", "float32", "--out", str(run), "--no-report"]
    main([*args, "--methods", "vanilla,sd"])
    before = comparable(read_rows(run))
    main([*args, "--methods", "typical:posterior_threshold=0.2"])  # only the new method runs
    spec = json.loads((run / "run.json").read_text())
    assert [m["name"] for m in spec["methods"]] == ["vanilla", "sd", "typical:posterior_threshold=0.2"]
    assert spec["added"][0]["methods"] == ["typical:posterior_threshold=0.2"]
    assert "date" in spec["added"][0]["environment"]
    after = comparable(read_rows(run))
    assert {k: after[k] for k in before} == before and len(after) == 6
    assert summarise(run)["problems"] == 2
    config = tmp_path / "methods.json"  # the same name with another definition is refused
    config.write_text(json.dumps({"methods": [{"name": "sd", "drafter": "model", "rule": "typical"}]}))
    with pytest.raises(SystemExit, match="other definitions of sd"):
        main([*args, "--methods", "vanilla", "--config", str(config)])


def test_two_process_shards_merge_to_the_single_process_rows(tiny_checkpoint, tmp_path):
    single = tmp_path / "single"
    main(compare_args(tiny_checkpoint, single, extra=["--no-report"]))
    sharded = tmp_path / "sharded"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "semverify.cli", *compare_args(tiny_checkpoint, sharded)]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=600,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert sorted(p.name for p in sharded.glob("rows.rank*.jsonl")) == ["rows.rank0.jsonl", "rows.rank1.jsonl"]
    assert comparable(read_rows(sharded)) == comparable(read_rows(single))
    report(sharded)
    assert "4 problems" in (sharded / "report.md").read_text()


def test_draft_alone_decodes_with_the_draft_model(tiny_checkpoint, tmp_path):
    other = tmp_path / "other-checkpoint"  # a different random model as the draft
    tok = byte_tokenizer()
    model = tiny_model(1, arch="llama", vocab=len(tok))
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(other)
    tok.save_pretrained(other)
    common = ["--data", "sample", "--limit", "2", "--max-new-tokens", "12", "--dtype", "float32", "--no-report"]
    main(["compare", "--target", str(tiny_checkpoint), "--draft", str(other), "--methods", "vanilla,draft_alone",
          "--out", str(tmp_path / "pair"), *common])
    main(["compare", "--target", str(other), "--methods", "vanilla", "--out", str(tmp_path / "draft"), *common])
    pair, alone = read_rows(tmp_path / "pair"), read_rows(tmp_path / "draft")
    def outputs(rows, name):
        return [r["output"] for r in sorted(rows, key=lambda r: r["id"]) if r["method"] == name]

    assert outputs(pair, "draft_alone") == outputs(alone, "vanilla") != outputs(pair, "vanilla")
    assert not get_method("draft_alone").lossless() and get_method("vanilla").lossless()
    assert get_method("draft_alone").to_dict()["decoder"] == "draft"
    assert "decoder" not in get_method("vanilla").to_dict()
    with pytest.raises(ValueError, match="takes drafter 'none'"):
        Method("x", "model", decoder="draft")
    with pytest.raises(ValueError, match="decoder must be"):
        Method("x", "none", decoder="both")


def _run_resumed_on_a_second_machine(run_dir):
    """A run of vanilla and draft_alone started on "slow cpu" and resumed on "fast cpu"; returns its row writer."""
    env = {"cpu": "slow cpu", "torch_threads": 2, "date": "d"}
    settings = {"target": "t", "draft": "d", "dtype": "float32", "benchmark": "gsm8k", "data": "sample",
                "template": "chat", "max_new_tokens": 8, "do_sample": False, "temperature": 1.0, "top_k": None,
                "top_p": None, "seed": 0}
    (run_dir / "run.json").write_text(json.dumps({
        "settings": settings, "environment": env, "resumed": [{**env, "cpu": "fast cpu"}],
        "methods": [get_method("vanilla").to_dict(), get_method("draft_alone").to_dict()]}))
    return RowWriter(run_dir / "rows.rank0.jsonl")


def test_speedups_compare_rows_of_one_machine_only(tmp_path):
    writer = _run_resumed_on_a_second_machine(tmp_path)
    for i in range(3):  # problem 2's draft_alone row was written after a resume on a faster machine
        writer.write(run_row(i, "vanilla", 4.0, "slow cpu"))
        writer.write(run_row(i, "draft_alone", 40.0 if i == 2 else 8.0, "fast cpu" if i == 2 else "slow cpu"))
    writer.close()
    summary = summarise(tmp_path)
    alone = summary["methods"]["draft_alone"]
    assert alone["speedup_median"] == 2.0 and alone["speedup_problems"] == 2 and alone["accuracy"]["strict"]["n"] == 3
    text = report(tmp_path)
    assert "machine: slow cpu (resumed on fast cpu)" in text
    assert "speedup of `draft_alone` over 2 of 3 problems" in text and "speedup of `vanilla`" not in text
    assert alone["speedup_by_machine"] == {"slow cpu": {"median": 2.0, "problems": 2}}
    assert "by machine" not in text  # every timed pair ran on one machine


def test_a_method_without_rows_is_named_and_can_be_left_out(tmp_path):
    writer = _run_resumed_on_a_second_machine(tmp_path)
    for i in range(2):  # draft_alone was added to the run but has no rows yet
        writer.write(run_row(i, "vanilla", 4.0, "slow cpu"))
    writer.close()
    with pytest.raises(ValueError, match=r"rows per method: vanilla: 2, draft_alone: 0.*--methods"):
        summarise(tmp_path)
    with pytest.raises(ValueError, match="'sd' is not in this run"):
        summarise(tmp_path, only=["sd"])
    summary = summarise(tmp_path, only=["vanilla"])
    assert summary["problems"] == 2 and list(summary["methods"]) == ["vanilla"]
    assert "2 problems" in report(tmp_path, only=["vanilla"], out=tmp_path / "subset")
    assert (tmp_path / "subset" / "summary.json").exists() and not (tmp_path / "report.md").exists()


def test_reports_regrade_rows_written_by_an_older_grader(tmp_path):
    writer = _run_resumed_on_a_second_machine(tmp_path)
    for i in range(2):  # stored as an older strict grader, which did not read \boxed{}, graded them
        writer.write(run_row(i, "vanilla", 4.0, "slow cpu", "So the total is \\boxed{5}.", (False, True, True)))
        writer.write(run_row(i, "draft_alone", 8.0, "slow cpu", "So the total is 4.", (False, True, True)))
    writer.close()
    methods = summarise(tmp_path)["methods"]
    assert methods["vanilla"]["accuracy"]["strict"]["correct"] == 2
    assert methods["draft_alone"]["accuracy"]["flexible"]["correct"] == 0
    assert methods["draft_alone"]["paired"]["vanilla"]["p_value"] == 0.5
    code = get_benchmark("humaneval")  # pass@1 needs the tests, which rows do not hold: stored grades stay
    row = {"id": 0, "gold": "f", "output": "", "grades": {"pass@1": True}}
    assert code.regrade(row) == row


def test_left_out_problems_are_not_counted_and_the_report_names_them(tmp_path):
    writer = _run_resumed_on_a_second_machine(tmp_path)
    for i in range(4):  # draft_alone wrong on problems 1-2 only (rows at the cap, with a final answer)
        writer.write(run_row(i, "vanilla", 4.0, "slow cpu", "Final Answer: 5"))
        writer.write(run_row(i, "draft_alone", 8.0, "slow cpu", f"Final Answer: {4 if i in (1, 2) else 5}"))
    writer.close()
    assert summarise(tmp_path)["methods"]["draft_alone"]["accuracy"]["flexible"]["acc"] == 0.5
    kept = summarise(tmp_path, leave_out=parse_spans("1-2"))
    assert kept["problems"] == 2 and kept["methods"]["draft_alone"]["accuracy"]["flexible"]["acc"] == 1.0
    assert "- left out: problems 1-2 (`--leave-out`)" in report(tmp_path, leave_out=parse_spans(" 2,1 "))
    assert spans([7, 100, 101, 102, 3]) == "3, 7, 100-102" and parse_spans(spans([7, 100, 101])) == {7, 100, 101}
    with pytest.raises(ValueError, match="not a problem id or range: '5-2'"):
        parse_spans("1,5-2")
    with pytest.raises(SystemExit, match="--leave-out: not a problem id or range: 'x'"):
        main(["report", str(tmp_path), "--leave-out", "x"])


def test_a_method_timed_on_no_shared_machine_has_no_speedup_cell(tmp_path):
    writer = _run_resumed_on_a_second_machine(tmp_path)
    for i in range(2):
        writer.write(run_row(i, "vanilla", 4.0, "slow cpu"))
        writer.write(run_row(i, "draft_alone", 8.0, "fast cpu"))
    writer.close()
    text = report(tmp_path)
    assert "0.00x" not in text and "no speedup for `draft_alone` (nor a point in the plot)" in text


def test_speedups_are_also_given_per_machine_when_a_run_spans_machines(tmp_path):
    writer = _run_resumed_on_a_second_machine(tmp_path)
    for i, (cpu, ratio) in enumerate([("slow cpu", 1.0), ("slow cpu", 1.5), ("fast cpu", 3.0)]):
        writer.write(run_row(i, "vanilla", 4.0, cpu))
        writer.write(run_row(i, "draft_alone", 4.0 * ratio, cpu))
    writer.close()
    alone = summarise(tmp_path)["methods"]["draft_alone"]
    assert alone["speedup_by_machine"] == {"slow cpu": {"median": 1.25, "problems": 2},
                                           "fast cpu": {"median": 3.0, "problems": 1}}
    text = report(tmp_path)
    assert "| method | slow cpu | fast cpu |" in text and "| draft_alone | 1.25x (2) | 3.00x (1) |" in text


def test_a_batched_run_writes_the_rows_of_the_unbatched_one(tiny_checkpoint, tmp_path):
    single, batched = tmp_path / "single", tmp_path / "batched"
    main(compare_args(tiny_checkpoint, single, limit=3, extra=["--no-report"]))
    main(compare_args(tiny_checkpoint, batched, limit=3, extra=["--batch-size", "2"]))
    drop = {"batch"}
    rows = {k: {f: v for f, v in r.items() if f not in drop} for k, r in comparable(read_rows(batched)).items()}
    assert rows == comparable(read_rows(single))  # fp32 greedy: every problem's row is its batch-1 row
    batch_sizes = sorted(r["batch"]["size"] for r in read_rows(batched) if "batch" in r)
    assert batch_sizes == [2] * 8  # problems 0-1 in batches of two per method, problem 2 alone
    summary = json.loads((batched / "summary.json").read_text())
    assert summary["batched"] and summary["methods"]["vanilla"]["speedup"] == pytest.approx(1.0)
    assert "ratio of total tokens/s (batches of 2" in (batched / "report.md").read_text()
    with pytest.raises(SystemExit, match="specreason decode one problem at a time"):
        main(compare_args(tiny_checkpoint, tmp_path / "steps", extra=["--batch-size", "2", "--methods",
                                                                       "specreason"]))


def test_time_per_step_in_units_of_the_reference_token_time():
    reference = [{"total_time": 10.0, "new_tokens": 10, "tok_s": 1.0},
                 {"total_time": 40.0, "new_tokens": 20, "tok_s": 0.5}]
    method = [{"steps": 2, "drafted": 8, "accepted": 6, "new_tokens": 10, "draft_time": 4.0, "verify_time": 2.0,
               "total_time": 7.0, "tok_s": 10 / 7.0},  # in problem 1's units (1 s a token): 4 + 2 + 1 over 2 steps
              {"steps": 2, "drafted": 8, "accepted": 6, "new_tokens": 10, "draft_time": 8.0, "verify_time": 4.0,
               "total_time": 14.0, "tok_s": 10 / 14.0}]  # the same in the second's (2 s a token)
    timing = machine_timing(method, reference)
    assert timing["step_cost"] == {"draft": 2.0, "verify": 1.0, "other": 0.5}
    assert timing["draft_per_token"] == 0.5 and timing["tau"] == 5.0 and timing["problems"] == 2
    assert timing["unkept_draft"] == 0.5  # 4 of 16 drafted tokens not kept, at 0.5 a token, over 4 steps
    assert timing["median"] == pytest.approx(10 / 7)
    assert "step_cost" not in machine_timing([{k: v for k, v in r.items() if k != "draft_time"} for r in method],
                                             reference)  # rows written before timings were split


def test_substitutions_are_counted_with_digits_and_the_answers_they_cost(tmp_path):
    writer = _run_resumed_on_a_second_machine(tmp_path)
    wrong = ("So the total is 6.\nFinal Answer: 6", (False, False, False))  # answered: graded despite the cap
    subs = [[{"at": 3, "reason": "topk", "kept": " 6", "target": " 5"}, {"at": 7, "reason": "topk", "kept": " so",
                                                                        "target": " thus"}],
            [{"at": 1, "reason": "window", "kept": " 6", "target": " 5"}], []]
    for i, logged in enumerate(subs):
        writer.write(run_row(i, "vanilla", 4.0, "slow cpu", "So the total is 5.\nFinal Answer: 5"))
        answer = wrong if i == 0 else ("So the total is 5." + ("\nFinal Answer: 5" if i == 1 else ""),)
        row = run_row(i, "draft_alone", 8.0, "slow cpu", *answer)
        writer.write({**row, "substitutions": logged} if i < 2 else row)  # problem 2's row predates the log
    writer.close()
    sub = summarise(tmp_path)["methods"]["draft_alone"]["substitutions"]
    assert sub["rows"] == 2 and sub["count"] == 3 and sub["digits"] == 2 and sub["new_tokens"] == 20
    assert sub["problems_with_digit"] == 2 and sub["lost_with_digit"] == 1
    assert sub["common"][0] == ((" 6", " 5"), 2)
    assert summarise(tmp_path)["methods"]["draft_alone"]["at_cap"] == 3  # run_row's 10 tokens reach the cap of 8
    # at the cap without a final answer, draft_alone's "So the total is 5." (problem 2) is no answer
    assert summarise(tmp_path)["methods"]["draft_alone"]["cap_regraded"] == 1
    assert summarise(tmp_path)["methods"]["vanilla"]["cap_regraded"] == 0
    assert "cut off at the cap without a final answer (their last number matched): `draft_alone` 1" in report(tmp_path)
    assert summarise(tmp_path)["methods"]["vanilla"]["substitutions"] is None
    assert ("`draft_alone` kept 3 tokens the target would not have chosen (15.00 per 100 new tokens, over the 2 "
            "problems that logged them); 2 involve a digit, in 2 problems, of which `vanilla` solved and this "
            "method missed 1; commonest: ' 6' for ' 5' (2), ' so' for ' thus' (1)") in report(tmp_path)


def test_coupled_samples_pair_lossless_methods_with_vanilla_row_for_row(tiny_checkpoint, tmp_path):
    out = tmp_path / "coupled"
    args = compare_args(tiny_checkpoint, out, limit=3, extra=["--do-sample", "--temperature", "0.8", "--coupled",
                                                              "--samples", "2"])
    args[args.index("--methods") + 1] = "vanilla,sd,pld"
    main(args)
    rows = {(r["id"], r["method"], r["sample"]): r for r in read_rows(out)}
    assert len(rows) == 3 * 3 * 2
    for pid in range(3):
        for sample in range(2):
            vanilla = rows[(pid, "vanilla", sample)]["output_ids"]
            assert rows[(pid, "sd", sample)]["output_ids"] == vanilla
            assert rows[(pid, "pld", sample)]["output_ids"] == vanilla
    assert any(rows[(p, "vanilla", 0)]["output_ids"] != rows[(p, "vanilla", 1)]["output_ids"] for p in range(3))
    assert rows[(0, "vanilla", 0)]["seed"] != rows[(0, "vanilla", 1)]["seed"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == 3 and summary["outputs"] == 6
    paired = summary["methods"]["sd"]["paired"]["vanilla"]
    assert paired["difference"]["difference"] == paired["difference"]["low"] == paired["difference"]["high"] == 0
    assert paired["divergence"]["identical"] == 6 and paired["divergence"]["flips"] == 0
    assert "| sd | +0.0 [+0.0, +0.0] |" in (out / "report.md").read_text()
    assert "`sd` (lossless) equals `vanilla` token for token on every output" in (out / "report.md").read_text()
    before = (out / "rows.rank0.jsonl").read_text()
    main(args)  # resumes: every (problem, method, sample) is done
    assert (out / "rows.rank0.jsonl").read_text() == before

    # a lossless row that differs is named with its first diverging token and the target's top-2 margin there
    rows_file = out / "rows.rank0.jsonl"
    lines = [json.loads(line) for line in rows_file.read_text().splitlines()]
    for row in lines:
        if (row["id"], row["method"], row["sample"]) == (1, "pld", 0):
            row["output_ids"] = row["output_ids"][:2] + [(row["output_ids"][2] + 1) % 200] + row["output_ids"][3:]
            row["output"] += " (changed)"
    rows_file.write_text("".join(json.dumps(row) + "\n" for row in lines))
    text = report(out, margins=True)
    margin = json.loads((out / "margins.json").read_text())["pld/1/0"]
    assert margin >= 0
    assert ("`pld` (lossless) differs from `vanilla` on 1 output(s): problem 1 sample 0 at token 2 "
            f"(top-2 margin {margin:.3g})") in text
    with pytest.raises(SystemExit, match="--do-sample"):
        main(compare_args(tiny_checkpoint, tmp_path / "greedy", extra=["--samples", "2"]))


def test_noise_keyed_by_context_pairs_lossless_methods_and_the_report_names_it(tiny_checkpoint, tmp_path):
    sampled = ["--do-sample", "--temperature", "0.8", "--coupled"]
    runs = {}
    for name, extra in (("context", ["--coupled-context", "2"]), ("position", [])):
        args = compare_args(tiny_checkpoint, tmp_path / name, limit=3, extra=sampled + extra)
        args[args.index("--methods") + 1] = "vanilla,sd"
        main(args)
        runs[name] = {(r["id"], r["method"]): r["output_ids"] for r in read_rows(tmp_path / name)}
    assert all(runs["context"][(p, "sd")] == runs["context"][(p, "vanilla")] for p in range(3))
    assert any(runs["context"][(p, "vanilla")] != runs["position"][(p, "vanilla")] for p in range(3))
    assert "coupled (noise keyed by the last 2 tokens)" in (tmp_path / "context" / "report.md").read_text()
    assert "coupled (noise keyed by position)" in (tmp_path / "position" / "report.md").read_text()
    with pytest.raises(SystemExit, match="add --coupled"):
        main(compare_args(tiny_checkpoint, tmp_path / "alone", extra=["--do-sample", "--coupled-context", "2"]))


def test_dtype_fastest_is_chosen_once_per_run_and_kept_by_its_resumes(tiny_checkpoint, tmp_path, monkeypatch):
    import semverify.cost

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path / "cache"))
    fast = {"dtype": torch.float32}

    def fake_seconds(model, context, sizes, *args, **kwargs):  # the dtype in ``fast`` is the quick one
        return {n: (1.0 if model.dtype == fast["dtype"] else 3.0) + n for n in sizes}

    monkeypatch.setattr(semverify.cost, "forward_seconds", fake_seconds)
    run = tmp_path / "run"
    args = [a if a != "float32" else "fastest" for a in compare_args(tiny_checkpoint, run, limit=1,
                                                                      extra=["--no-report"])]
    assert main(args) == 0
    recorded = json.loads((run / "run.json").read_text())
    assert recorded["settings"]["dtype"] == "fastest"
    assert {recorded["dtypes"]["target"], recorded["dtypes"]["draft"]} == {"float32"}
    assert recorded["dtypes"]["why"]["draft"]["seconds_per_token"] == {"torch.float32": 1.0, "torch.bfloat16": 3.0}
    fast["dtype"] = torch.bfloat16  # the machine now favours bfloat16: a new run chooses it, a resume keeps float32
    (tmp_path / "cache").rename(tmp_path / "old-cache")
    rows = run / "rows.rank0.jsonl"
    rows.write_text("".join(rows.read_text().splitlines(keepends=True)[:2]))  # as if killed after two rows
    assert main(args) == 0
    assert json.loads((run / "run.json").read_text())["dtypes"] == recorded["dtypes"]
    assert len(read_rows(run)) == len(METHODS.split(",")) and not (tmp_path / "cache").exists()  # nothing measured
    assert main([*args[:args.index("--out") + 1], str(tmp_path / "new"), "--no-report"]) == 0
    assert json.loads((tmp_path / "new" / "run.json").read_text())["dtypes"]["target"] == "bfloat16"
