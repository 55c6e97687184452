"""``semverify report``: table, paired tests and plots for a compare run folder."""

from __future__ import annotations

import argparse

from evals.grading import CODE_GRADERS, GRADERS, MATH_GRADERS
from evals.report import report
from semverify.commands import Command


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument("--reference", default="vanilla", help="method speedups are measured against")
    p.add_argument("--paired", default=None,
                   help="comma-separated methods to run the paired McNemar test against (default: the reference)")
    p.add_argument("--grader", default=None, choices=sorted(set(GRADERS) | set(MATH_GRADERS) | set(CODE_GRADERS)),
                   help="the grade the paired tests and plots use (each benchmark has its own set; default "
                        "math_verify for GSM8K and MATH-500, pass@1 for HumanEval)")


def run(args: argparse.Namespace) -> int:
    paired = [m.strip() for m in args.paired.split(",") if m.strip()] if args.paired else None
    print(report(args.run_dir, args.reference, args.grader, paired))
    return 0


COMMAND = Command("report", "table, paired test and plots for a compare run folder", configure, run)
