"""The 500-problem GSM8K table's figures in README.md and docs/results.md are the committed reports' figures.

That table grows by a batch each session and its counts and intervals are quoted in several places; this test
reads them from `results/gsm8k-500/*/summary.json` (no model, no regrading) so that a report regenerated without
its quotes (or quotes edited without a report) fails CI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evals.paired import as_points, interval_points

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "results" / "gsm8k-500"
REPORTS = {"math_verify": TABLE / "vanilla-easd-sense", "program_run": TABLE / "vanilla-easd-sense-program-run"}
REFERENCE = "vanilla"
METHODS = ("sense_id_p70", "easd")
README_ROW_MARK = "| GSM8K 500-table"


def summary(grader: str) -> dict:
    return json.loads((REPORTS[grader] / "summary.json").read_text())


def correct(s: dict, method: str, grader: str) -> int:
    return s["methods"][method]["accuracy"][grader]["correct"]


def paired(s: dict, method: str) -> str:
    """The method's paired difference from the reference as the docs write it: '+6.2 [+0.7, +11.6]'."""
    d = s["methods"][method]["paired"][REFERENCE]["difference"]
    return as_points(d["difference"], d["low"], d["high"])


def quotes(grader: str) -> dict[str, list[str]]:
    """What the docs must say about each method on this grader: counts of correct answers and paired intervals."""
    s = summary(grader)
    of_n = f"/{s['problems']}" if grader == "math_verify" else ""  # the row gives n with the text-grade counts
    reference = f"{correct(s, REFERENCE, grader)}{of_n}"
    out = {REFERENCE: [f"({reference})" if of_n else reference]}
    for method in METHODS:
        out[method] = [f"{correct(s, method, grader)}{of_n}", paired(s, method)]
    return out


def readme_row() -> str:
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(README_ROW_MARK)]
    assert len(rows) == 1, f"README.md should have one row starting {README_ROW_MARK!r}, has {len(rows)}"
    return rows[0]


def test_both_reports_cover_the_same_problems() -> None:
    assert summary("math_verify")["problems"] == summary("program_run")["problems"]
    assert summary("math_verify")["grader"] == "math_verify"
    assert summary("program_run")["grader"] == "program_run"


@pytest.mark.parametrize("grader", sorted(REPORTS))
def test_the_readme_row_quotes_the_reports(grader: str) -> None:
    row = readme_row()
    n = summary(grader)["problems"]
    assert f"first {n} problems" in row or f"all {n} problems" in row, f"README's 500-table row does not say n = {n}"
    for method, strings in quotes(grader).items():
        for text in strings:
            assert text in row, f"README's 500-table row lacks {text!r} ({method}, {grader}, {n} problems)"


def test_the_anytime_valid_interval_is_quoted() -> None:
    difference = summary("math_verify")["methods"]["sense_id_p70"]["paired"][REFERENCE]["difference"]
    anytime = interval_points(difference["anytime_low"], difference["anytime_high"])
    for page in (ROOT / "README.md", ROOT / "docs" / "results.md"):
        text = page.read_text()
        assert f"anytime-valid {anytime}" in text or f"anytime-valid interval, {anytime}" in text, (
            f"{page.name} does not quote SENSE's anytime-valid interval {anytime}"
        )


@pytest.mark.parametrize("grader", sorted(REPORTS))
def test_the_results_page_quotes_the_reports(grader: str) -> None:
    text = " ".join((ROOT / "docs" / "results.md").read_text().split())
    s = summary(grader)
    for method in METHODS:
        interval = paired(s, method)
        pair = f"{correct(s, method, grader)} against {correct(s, REFERENCE, grader)}"
        assert f"{pair}, {interval}" in text or f"{pair} of {s['problems']} problems, {interval.split(' ', 1)[0]}" in (
            text
        ), f"docs/results.md does not quote {method} on {grader}: {pair}, {interval}"
