"""``semverify report``: table, paired tests and plots for a compare run folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evals.grading import CODE_GRADERS, GRADERS, MATH_GRADERS
from evals.report import parse_spans, report
from evals.rerun import against, against_markdown
from semverify.commands import Command
from semverify.plugins import add_plugin_option, load_plugins

from .common import names, plugin_hint


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument("--reference", default="vanilla", help="method speedups are measured against")
    p.add_argument("--paired", default=None,
                   help="comma-separated methods to run the paired McNemar test against (default: the reference)")
    p.add_argument("--methods", default=None,
                   help="comma-separated methods to report (with the reference and the paired ones; default all): "
                        "the table covers the problems every reported method finished")
    p.add_argument("--grader", default=None, choices=sorted(set(GRADERS) | set(MATH_GRADERS) | set(CODE_GRADERS)),
                   help="the grade the paired tests and plots use (each benchmark has its own set; default "
                        "math_verify for GSM8K and MATH-500, pass@1 for HumanEval)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for report.md, summary.json and the plots (default: the run folder), e.g. to keep "
                        "a report on a subset of the methods beside the run's own")
    p.add_argument("--margins", action="store_true",
                   help="load the run's target and measure its top-2 logit margin at the first token where a "
                        "lossless method's output differs from the reference's (a numerical tie or a bug?); "
                        "saved to RUN_DIR/margins.json, which later reports list")
    p.add_argument("--leave-out", default="", metavar="IDS",
                   help="problem ids not to count, e.g. 100-115 (those a threshold was chosen on); with --out, a "
                        "report beside the run's own")
    p.add_argument("--against", default=None, metavar="OTHER_RUN",
                   help="instead: each method both runs hold, side by side on the problems both finished (a rerun "
                        "with another batch size, dtype or machine); written to RUN_DIR/against-<other>.md")
    add_plugin_option(p)  # the rules of a run's plugin methods (is each lossless?), their drafters


def run(args: argparse.Namespace) -> int:
    load_plugins(args.plugin, "--plugin")
    hint = plugin_hint(args.run_dir)
    if hint:  # their methods' drafters are unknown here, and whether their rules are lossless
        print(f"semverify report: {hint}", file=sys.stderr)
    if args.against:
        text = against_markdown(against(args.run_dir, args.against, args.grader))
        (Path(args.run_dir) / f"against-{Path(args.against).resolve().name}.md").write_text(text)
        print(text)
        return 0
    paired, only = names(args.paired) or None, names(args.methods) or None
    try:
        leave_out = parse_spans(args.leave_out)
    except ValueError as err:
        raise SystemExit(f"semverify report --leave-out: {err}") from err
    print(report(args.run_dir, args.reference, args.grader, paired, only, args.out, margins=args.margins,
                 leave_out=leave_out))
    return 0


COMMAND = Command("report", "table, paired test and plots for a compare run folder", configure, run)
