"""GSM8K graders on tricky answer strings: number normalization, strict and flexible extraction, Math-Verify."""

from __future__ import annotations

import pytest

from evals import grading
from evals.grading import GRADERS, extract_flexible, extract_strict, grade, grade_math_verify, normalize_number


@pytest.mark.parametrize("text, expected", [
    ("1,234", "1234"),
    ("$18", "18"),
    ("-3.5", "-3.5"),
    ("-3.50", "-3.5"),
    ("7.0", "7"),
    ("7", "7"),
    ("007", "7"),
    ("0.50", "0.5"),
    (".5", "0.5"),
    ("1,234.", "1234"),
    (" $1,234.50 ", "1234.5"),
    ("-$3.5", "-3.5"),
    ("100", "100"),
    ("1000000", "1000000"),
    ("-0.0", "0"),
    ("123456789012345678901234567890.10", "123456789012345678901234567890.1"),
])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "abc", "7 apples", "-", ".", "$", "3.5.2", "1e3", "nan", "Infinity",
                                  "50%", "1/2", "\u0663"])
def test_normalize_number_rejects_non_numbers(text):
    assert normalize_number(text) is None


@pytest.mark.parametrize("output, strict, flexible", [
    ("Final Answer: 72", "72", "72"),
    ("final answer: 72", "72", "72"),
    ("FINAL ANSWER:72", "72", "72"),
    ("Final Answer: $72", "72", "72"),
    ("**Final Answer:** $18", "18", "18"),
    ("**Final Answer**: 18", "18", "18"),
    ("Final Answer: **18**", "18", "18"),
    ("Final Answer: 1,234.", "1234", "1234"),
    ("Final Answer: 1,234,567", "1234567", "1234567"),
    ("Final Answer: -3.5", "-3.5", "-3.5"),
    ("Final Answer: -$3.5", "-3.5", "-3.5"),
    ("Final Answer: 0.50", "0.5", "0.5"),
    ("Final Answer: 7.0", "7", "7"),
    ("#### 72", "72", "72"),
    ("So the total is 3 + 4 = 7.\n#### 7", "7", "7"),
    # several numbers: strict reads the explicit answer, flexible the last number
    ("Final Answer: 5. Check: 5 + 3 = 8", "5", "8"),
    ("She has 3 apples and buys 4 more.\nFinal Answer: 7\nThat took 2 steps.", "7", "2"),
    # the last "Final Answer:" wins, and it wins over "####"
    ("Final Answer: 4. Wait, I made a mistake. Final Answer: 6", "6", "6"),
    ("#### 3\nFinal Answer: 9", "9", "9"),
    # the Qwen models box their answer: strict reads the last \\boxed{} number when there is no "Final Answer:"
    ("\\boxed{72}", "72", "72"),
    ("So $\\boxed{1,234}$ dollars.", "1234", "1234"),
    ("\\boxed{5} ... Final Answer: 6", "6", "6"),
    ("\\boxed{x + 1}", None, "1"),
    # no explicit answer format: strict has nothing, flexible still finds a number
    ("The answer is 72.", None, "72"),
    ("Final Answer: seventy-two", None, None),
    ("Final Answer is 72", None, "72"),
    ("There is no number here.", None, None),
    ("", None, None),
    # a hyphen inside a range is not a minus sign; malformed thousands groups are separate numbers
    ("It takes 10-12 days", None, "12"),
    ("pick 5,6", None, "6"),
])
def test_extract(output, strict, flexible):
    assert extract_strict(output) == strict
    assert extract_flexible(output) == flexible


@pytest.mark.parametrize("output", ["Final Answer: 72", "\\boxed{72}", "#### 72", "The answer is $\\boxed{72}$.",
                                    "**Final Answer:** $72"])
def test_math_verify_accepts_right_answer(output):
    assert grade_math_verify(output, "72")


@pytest.mark.parametrize("output", ["Final Answer: 71", "\\boxed{27}", "#### 720", "no number at all", ""])
def test_math_verify_rejects_wrong_answer(output):
    assert not grade_math_verify(output, "72")


def test_math_verify_errors_grade_false(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("parser crashed")

    monkeypatch.setattr(grading, "parse", broken)
    assert grade_math_verify("Final Answer: 72", "72") is False


T, F = True, False


@pytest.mark.parametrize("output, gold, strict, flexible, math_verify", [
    ("Final Answer: 1,234", "1234", T, T, T),
    ("Final Answer: 1234", "1,234", T, T, T),
    ("Final Answer: 1,234.", "1,234", T, T, T),
    ("**Final Answer:** $18", "18", T, T, T),
    ("Final Answer: $18.00", "18", T, T, T),
    ("Final Answer: -3.5", "-3.5", T, T, T),
    ("Final Answer: -3", "3", F, F, F),
    ("Final Answer: 7.0", "7", T, T, T),
    ("Final Answer: 0.50", "0.5", T, T, T),
    ("Final Answer: 007", "7", T, T, T),
    ("\\boxed{72}", "72", T, T, T),
    ("#### 72", "72", T, T, T),
    ("Final Answer: 5. Check: 5 + 3 = 8", "5", T, F, F),
    ("Final Answer: 5. Check: 5 + 3 = 8", "8", F, T, T),
    ("Final Answer: 71", "72", F, F, F),
    ("I cannot solve this.", "72", F, F, F),
    ("", "0", F, F, F),
])
def test_grade(output, gold, strict, flexible, math_verify):
    # prose answers: the program-run grade is the Math-Verify grade
    assert grade(output, gold) == {"strict": strict, "flexible": flexible, "math_verify": math_verify,
                                   "program_run": math_verify}


def test_grade_reports_every_grader():
    assert tuple(grade("Final Answer: 1", "1")) == GRADERS == ("strict", "flexible", "math_verify", "program_run")


def test_a_program_answer_is_graded_by_running_it_beside_the_text_grades():
    # the program prints 12; the text claims an output of 13 and boxes it
    invented = "```python\nprint(5 + 7)\n```\n```output\n13\n```\nSo the answer is \\boxed{13}."
    assert grade(invented, "12") == {"strict": F, "flexible": F, "math_verify": F, "program_run": T}
    assert grade(invented, "13") == {"strict": T, "flexible": T, "math_verify": T, "program_run": F}
    assert grading.printed_number.__wrapped__("while True:\n    pass\n", timeout=1.0) is None  # killed at its timeout
    assert not grading.grade_program_run("```python\nprint(1 / 0)\n```\n\\boxed{3}", "3", True)  # a failed run


@pytest.mark.parametrize("output, gold, boxed, math_verify", [
    ("so the answer is $\\boxed{\\dfrac{14}{3}}$.", "\\frac{14}{3}", T, T),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", T, T),
    ("\\boxed{\\frac{28}{6}}", "\\frac{14}{3}", F, T),  # equal values, other text: only math-verify
    ("\\boxed{2} then \\boxed{3}", "3", T, F),  # the boxed grader reads the last box, math-verify the first
    ("\\boxed{5}", "6", F, F),
    ("no box here: 6", "6", F, T),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}", T, T),
])
def test_math500_graders(output, gold, boxed, math_verify):
    assert grading.grade_math(output, gold) == {"boxed": boxed, "math_verify": math_verify}


def test_last_boxed_handles_nested_braces():
    assert grading.last_boxed("x \\boxed{\\frac{1}{2}} y") == "\\frac{1}{2}"
    assert grading.last_boxed("\\boxed{unclosed") is None and grading.last_boxed("none") is None


def test_an_output_cut_off_at_the_cap_without_a_final_answer_is_no_answer():
    from evals.benchmarks import Problem, get_benchmark

    gsm8k, math500 = get_benchmark("gsm8k"), get_benchmark("math500")
    problem = Problem(7, "", "110")
    rambling = "First we add the 50 from before: 50 + 60 = 110"  # cut mid-reasoning at 110
    assert gsm8k.grade_output(rambling, problem, capped=False)["flexible"]  # finished: the last number counts
    assert not any(gsm8k.grade_output(rambling, problem, capped=True).values())
    answered = rambling + " the total is 110.\nFinal Answer: 110\nLet me double-check"
    assert all(gsm8k.grade_output(answered, problem, capped=True).values())
    boxed = Problem(0, "", "\\frac{1}{2}")
    assert not any(math500.grade_output("so it is 1/2 and", boxed, capped=True).values())
    assert all(math500.grade_output("so \\boxed{\\frac{1}{2}} and", boxed, capped=True).values())
    row = {"id": 7, "gold": "110", "output": rambling, "new_tokens": 512, "grades": {}}
    assert not any(gsm8k.regrade(row, cap=512)["grades"].values())
    assert gsm8k.regrade(row, cap=1024)["grades"]["flexible"]
