"""HumanEval: model-written code is run against the tests in a sandboxed child process, never in ours."""

from __future__ import annotations

import json
import socket

import pytest

from evals.benchmarks import get_benchmark
from evals.code_exec import run_program
from evals.grading import code_program, extract_code


def test_a_program_passes_when_it_exits_cleanly():
    assert run_program("assert sum([1, 2]) == 3\n").passed
    failed = run_program("raise ValueError('wrong answer')\n")
    assert failed.status == "failed" and "wrong answer" in failed.detail


def test_runaway_programs_are_stopped():
    assert run_program("while True:\n    pass\n", timeout=1.0).status == "timed out"
    assert run_program("x = bytearray(4 << 30)\n", memory_mb=512).status == "failed"  # 4 GiB over a 512 MiB cap


@pytest.mark.parametrize("namespace", [True, False], ids=["network-namespace", "socket-guard"])
def test_the_program_has_no_network_and_its_own_folder(tmp_path, monkeypatch, namespace):
    from evals import code_exec

    if namespace and not code_exec.network_namespace():
        pytest.skip("unshare -rn is not available here")
    monkeypatch.setattr(code_exec, "network_namespace", lambda: namespace)
    with socket.create_server(("127.0.0.1", 0)) as server:  # a port this process does answer on
        port = server.getsockname()[1]
        probe = ("import socket\n"
                 "try:\n"
                 f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                 "except OSError:\n"
                 "    pass\n"
                 "else:\n"
                 "    raise SystemExit('connected')\n"
                 "import os\n"
                 f"assert os.getcwd() != {str(tmp_path)!r} and 'HOME' not in os.environ\n"
                 "open('stray.txt', 'w').write('x')\n")
        assert run_program(probe).passed
        assert not run_program(probe.replace("except OSError", "except ZeroDivisionError")).passed
    assert not (tmp_path / "stray.txt").exists()


def test_code_is_read_from_the_block_that_defines_the_function():
    answer = ("Here is a helper:\n```python\ndef helper():\n    return 1\n```\nand the function:\n"
              "```python\ndef add(a, b):\n    return a + b\n```\nDone.")
    assert extract_code(answer, "add") == "def add(a, b):\n    return a + b\n"
    assert extract_code("```\nx = 1\n```", "add") == "x = 1\n"  # no block defines it: the first block
    assert extract_code("    return a + b\n", "add") == "    return a + b\n"  # a bare body completion
    prompt = 'def add(a, b):\n    """Add."""\n'
    tests = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    assert run_program(code_program(prompt, "def add(a, b):\n    return a + b\n", tests, "add")).passed
    assert run_program(code_program(prompt, "    return a + b\n", tests, "add")).passed  # as a body
    assert not run_program(code_program(prompt, "def add(a, b):\n    return a - b\n", tests, "add")).passed


def test_humaneval_ships_and_its_canonical_solutions_pass():
    bench = get_benchmark("humaneval")
    problems = bench.load("auto")
    assert len(problems) == 164 and problems[0].meta == {"task_id": "HumanEval/0"}
    for p in problems[:5] + problems[-3:]:
        assert bench.grade(f"```python\n{p.question}{p.solution}```", p) == {"pass@1": True}, p.meta
        assert bench.grade("```python\ndef nothing():\n    pass\n```", p) == {"pass@1": False}
    assert "```python" in bench.messages(problems[0])[0]["content"]
    with pytest.raises(ValueError, match="test split only"):
        bench.load("auto", split="train")


def test_compare_on_humaneval_reports_pass_at_1(tiny_checkpoint, tmp_path):
    from semverify.cli import main

    out = tmp_path / "run"
    assert main(["compare", "--benchmark", "humaneval", "--target", str(tiny_checkpoint), "--dtype", "float32",
                 "--methods", "vanilla,pld", "--limit", "2", "--max-new-tokens", "8", "--out", str(out)]) == 0
    assert main(["report", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grader"] == "pass@1" and set(summary["methods"]["pld"]["accuracy"]) == {"pass@1"}
    assert "pass@1" in (out / "report.md").read_text()
