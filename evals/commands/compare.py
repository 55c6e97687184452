"""``semverify compare``: several methods on the same benchmark problems, resumable."""

from __future__ import annotations

import argparse

from evals.accuracy import compare_for_accuracy
from evals.report import report
from evals.runner import compare, shard_info
from semverify.commands import Command, non_negative_int
from semverify.methods import available_methods

from .common import add_run_args, checked_run, kept_rows


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default="vanilla,sd,pld,typical",
                   help="comma-separated built-in methods, each optionally name:key=value,... (built-ins: "
                        + ", ".join(available_methods()) + ")")
    p.add_argument("--config", action="append", default=None,
                   help='JSON file {"methods": [{name, drafter, rule, rule_params, k}]}; repeat to combine files')
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated names: run just these of the methods given by --methods and --config "
                        "(e.g. resume part of a run with its own configs)")
    add_run_args(p, limit=50, dtype=None)
    p.add_argument("--accuracy", action="store_true",
                   help="accuracy mode: float32 unless --dtype says otherwise, every method batched at the batch "
                        "size with the most total tokens/s for the target alone on this machine (measured when the "
                        "run starts, unless --batch-size is given; recorded in run.json), rows untimed")
    p.add_argument("--timed", type=non_negative_int, default=0, metavar="N",
                   help="with --accuracy: then run the first N problems one at a time into OUT/timed, for speedups")
    p.add_argument("--timed-dtype", default="bfloat16", help="the dtype of the --timed pass (default bfloat16)")
    p.add_argument("--no-report", action="store_true", help="skip writing the report at the end")


def run(args: argparse.Namespace) -> int:
    if args.timed and not args.accuracy:
        raise SystemExit("--timed is the timed pass of an accuracy run: add --accuracy")
    args.dtype = args.dtype or ("float32" if args.accuracy else "bfloat16")
    checked = checked_run(args, args.methods, args.config, args.only)
    out = (compare_for_accuracy(checked, args.out, args.repin, args.timed, args.timed_dtype) if args.accuracy
           else compare(checked, args.out, repin=args.repin))
    if not args.no_report and shard_info() == (0, 1):
        print(report(out))
    return 0


COMMAND = Command("compare", "run several methods on the same benchmark problems (resumable)", configure, run,
                  stopped=kept_rows)
