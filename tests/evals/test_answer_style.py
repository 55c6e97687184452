"""Answer style (program or prose): detection, running a program answer, and the paired split by style."""

from __future__ import annotations

import json

import pytest

from evals.answer_style import graded_rows, main, markdown, style_of, style_table
from evals.code_exec import run_program
from evals.grading import grade_program_run, program_of, same_number

# a program answer whose printed output the model made up (the program itself prints 12)
INVENTED = ("Let's compute it.\n```python\na = 5\nb = 7\nprint(a + b)\n```\n```output\n13\n```\n"
            "The answer is \\boxed{13}.")
PROSE = "5 + 7 = 12.\nFinal Answer: 12"


def test_only_python_fences_make_a_program_answer():
    assert program_of(INVENTED) == "a = 5\nb = 7\nprint(a + b)\n"
    assert style_of(INVENTED) == "program" and style_of(PROSE) == "prose"
    assert style_of("```\nx = 1\n```\n```output\n1\n```") == "prose"  # untagged and output fences are not code
    assert program_of("```py\nx = 1\n```\ntext\n```python\nprint(x)") == "x = 1\n\nprint(x)"  # joined; cut at the cap


def test_numbers_compare_by_value():
    assert same_number("12", "12") and same_number("3.4000000000000004", "3.4") and same_number("7.0", "7")
    assert not same_number("13", "12") and not same_number(None, "12")


def test_run_program_captures_what_it_printed():
    result = run_program("print('a')\nprint(6 * 7)\n", capture=True)
    assert result.passed and result.stdout == "a\n42\n"
    assert run_program("print(1)\n").stdout == ""  # not asked for
    failed = run_program("print(5)\nraise SystemExit(3)\n", capture=True)
    assert failed.status == "failed" and failed.stdout == "5\n"


def test_a_program_answer_is_graded_by_what_it_prints_when_run():
    assert grade_program_run(INVENTED, "12", False)  # the made-up 13 does not count, the program's 12 does
    assert not grade_program_run(INVENTED, "13", True)
    assert grade_program_run(PROSE, "12", True) and not grade_program_run(PROSE, "12", False)  # prose: as graded
    assert not grade_program_run("```python\nprint(12)\nraise ValueError\n```", "12", True)  # it must exit cleanly


def _row(pid: int, method: str, output: str, correct: bool) -> dict:
    return {"id": pid, "method": method, "sample": 0, "gold": "12", "output": output,
            "grades": {"math_verify": correct}}


@pytest.fixture
def run_dir(tmp_path):
    rows = [
        # problem 0: the reference writes a program and misreports it; the method writes prose and is right
        _row(0, "vanilla", INVENTED, False), _row(0, "rule", PROSE, True),
        # problem 1: both prose, the reference right, the method wrong
        _row(1, "vanilla", PROSE, True), _row(1, "rule", "5 + 7 = 11.\nFinal Answer: 11", False),
        # problem 2: both right in prose
        _row(2, "vanilla", PROSE, True), _row(2, "rule", PROSE, True),
        # problem 3: only the reference has a row, so it is left out
        _row(3, "vanilla", PROSE, True),
    ]
    (tmp_path / "rows.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_style_table_splits_paired_outcomes_by_the_pair_of_styles(run_dir):
    table = style_table(run_dir, "vanilla", ["rule"])
    assert table["outputs"] == 3 and table["problems"] == [0, 2]
    ref, rule = table["methods"]["vanilla"], table["methods"]["rule"]
    assert ref["program_share"] == pytest.approx(1 / 3)
    assert ref["by_style"] == {"program": {"outputs": 1, "correct": 0}, "prose": {"outputs": 2, "correct": 2}}
    assert rule["paired"] == {"program -> prose": {"won": 1, "lost": 0}, "prose -> prose": {"won": 0, "lost": 1}}
    assert "paired_with_programs_run" not in rule  # stored rows without a program_run grade


def test_running_the_programs_can_erase_a_style_win(run_dir):
    (run_dir / "run.json").write_text(json.dumps({"settings": {"benchmark": "gsm8k", "max_new_tokens": 512}}))
    table = style_table(run_dir, "vanilla", ["rule"])
    ref, rule = table["methods"]["vanilla"], table["methods"]["rule"]
    assert ref["by_style"]["program"]["correct_when_run"] == 1 and ref["correct_with_programs_run"] == 3
    run = rule["paired_with_programs_run"]  # run, the reference's program is right: the rule only lost problem 1
    assert (run["won"], run["lost"]) == (0, 1) and run["difference"] == pytest.approx(-100 / 3)
    text = markdown(table)
    assert "| rule | program -> prose | 1 | 0 | +1 |" in text and "| rule | -33.3 [" in text


def test_missing_methods_are_named(run_dir):
    with pytest.raises(ValueError, match="absent"):
        style_table(run_dir, "vanilla", ["absent"])


def test_the_command_writes_its_table_and_counts_a_stores_programs(run_dir, tmp_path, capsys):
    main([str(run_dir), "--methods", "rule"])
    assert json.loads((run_dir / "answer-style.json").read_text())["methods"]["rule"]["paired"]
    printed = capsys.readouterr().out
    assert "| rule | prose -> prose | 0 | 1 | -1 |" in printed and (run_dir / "answer-style.md").read_text() == printed
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"answer": INVENTED}) + "\n" + json.dumps({"answer": PROSE}) + "\n")
    main([str(run_dir), "--methods", "rule", "--out", str(tmp_path / "elsewhere")])
    assert (tmp_path / "elsewhere" / "answer-style.md").read_text() == printed
    main(["--answers", str(answers)])
    assert "1 of 2 answers are programs (50%)" in capsys.readouterr().out


def test_rows_are_graded_as_the_report_grades_them(tmp_path):
    rows = [{**_row(0, "vanilla", "5 + 7 = 12", True), "new_tokens": 64},  # cut off at the cap, no final answer
            {**_row(1, "vanilla", PROSE, False), "new_tokens": 10}]  # stored before a grader fix
    (tmp_path / "rows.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["grades"]["math_verify"] for r in graded_rows(tmp_path)] == [True, False]  # no run.json: as stored
    (tmp_path / "run.json").write_text(json.dumps({"settings": {"benchmark": "gsm8k", "max_new_tokens": 64}}))
    assert [r["grades"]["math_verify"] for r in graded_rows(tmp_path)] == [False, True]


def test_programs_are_run_only_for_gsm8k(run_dir):
    (run_dir / "run.json").write_text(json.dumps({"settings": {"benchmark": "math500", "max_new_tokens": 64}}))
    table = style_table(run_dir, "vanilla", ["rule"])
    assert "correct_with_programs_run" not in table["methods"]["vanilla"]
    assert "programs run" not in markdown(table)
