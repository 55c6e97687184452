"""Bad input at the command line, as a new user would give it: one line naming the argument or file and
what to do, exit status 2, no traceback (``--debug`` shows it)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from semverify.cli import main
from tests.helpers import REPO


def one_line_error(argv, capsys) -> str:
    """Run ``semverify argv`` in-process; the error must be a single line on stderr and exit status 2."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_a_data_row_without_a_field_names_the_line_and_field(tmp_path, capsys, tiny_checkpoint):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "q", "answer": "#### 1"}\n{"problem": "q", "answer": "#### 2"}\n')
    line = one_line_error(["compare", "--target", str(tiny_checkpoint), "--data", str(data), "--out",
                           str(tmp_path / "r")], capsys)
    assert line == (f"semverify compare: {data}, line 2: no 'question' field (each row needs question, answer)")


def test_a_corrupt_datastore_is_one_line(tmp_path, capsys, tiny_checkpoint):
    store = tmp_path / "ds.pt"
    torch.save({"something": "else"}, store)
    line = one_line_error(["compare", "--target", str(tiny_checkpoint), "--methods", "rest", "--datastore",
                           str(store), "--data", "sample", "--limit", "1", "--out", str(tmp_path / "r")], capsys)
    assert line == f"semverify compare: {store} is not a semverify datastore of format 1"


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt-lookup", "0", "hi"], "argument --prompt-lookup: must be at least 1, got 0"),
    (["compare", "--limit", "-3", "--out", "x"], "argument --limit: must be at least 1, got -3"),
    (["compare", "--limit", "two", "--out", "x"], "argument --limit: expected a whole number, got 'two'"),
    (["compare", "--methods", "vanilla,bogus", "--out", "x"], "semverify compare: unknown method 'bogus'"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_the_shell_sees_status_2_and_debug_shows_the_traceback(tmp_path):
    cmd = [sys.executable, "-m", "semverify.cli", "report", str(tmp_path / "nothing")]
    plain = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines()[-1].startswith("semverify report: ")
    debug = subprocess.run([*cmd, "--debug"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
