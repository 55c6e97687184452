"""``semverify compare``: several methods on the same benchmark problems, resumable."""

from __future__ import annotations

import argparse

from evals.report import report
from evals.runner import compare, shard_info
from semverify.commands import Command
from semverify.methods import available_methods

from .common import add_run_args, checked_run


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default="vanilla,sd,pld,typical",
                   help="comma-separated built-in methods, each optionally name:key=value,... (built-ins: "
                        + ", ".join(available_methods()) + ")")
    p.add_argument("--config", action="append", default=None,
                   help='JSON file {"methods": [{name, drafter, rule, rule_params, k}]}; repeat to combine files')
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated names: run just these of the methods given by --methods and --config "
                        "(e.g. resume part of a run with its own configs)")
    add_run_args(p, limit=50)
    p.add_argument("--no-report", action="store_true", help="skip writing the report at the end")


def run(args: argparse.Namespace) -> int:
    out = compare(checked_run(args, args.methods, args.config, args.only), args.out, repin=args.repin)
    if not args.no_report and shard_info() == (0, 1):
        print(report(out))
    return 0


COMMAND = Command("compare", "run several methods on the same benchmark problems (resumable)", configure, run)
