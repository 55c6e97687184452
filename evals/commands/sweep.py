"""``semverify sweep``: a method over a grid of its knobs, accuracy against speedup, and the setting to keep."""

from __future__ import annotations

import argparse
from pathlib import Path

from evals.runner import compare
from evals.sweep import frontier, grid_methods, parse_grid, write
from semverify.commands import Command

from .common import add_run_args, checked_run, kept_rows, names


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", required=True, help="the method to sweep, e.g. step_likelihood or semanticspec")
    p.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2,...",
                   help="values of one knob (rule parameter, k, drafter.NAME); repeat for a product grid")
    p.add_argument("--references", default="vanilla,sd",
                   help="methods run beside the grid on the same problems; the first is the accuracy reference")
    p.add_argument("--keep", type=float, default=0.98,
                   help="share of the reference's accuracy the pick must keep (default 0.98)")
    p.add_argument("--report-only", action="store_true",
                   help="write sweep.md, sweep.json and sweep.png from the rows already in --out, running nothing "
                        "(e.g. for a sweep that spans sessions); the table covers the problems every method finished")
    add_run_args(p, limit=30)


def run(args: argparse.Namespace) -> int:
    settings = grid_methods(args.method, parse_grid(args.grid))
    references = names(args.references)
    if not references:
        raise ValueError("--references needs at least the accuracy reference (e.g. vanilla)")
    if args.report_only:
        if not (Path(args.out) / "run.json").exists():
            raise FileNotFoundError(f"{args.out} holds no run yet (no run.json); run the sweep without --report-only")
        out = args.out
    else:
        out = compare(checked_run(args, ",".join(references + settings), None), args.out, repin=args.repin)
    print(write(frontier(out, settings, references[0], args.keep), out))
    return 0


COMMAND = Command("sweep", "run a method over a grid of its knobs and pick the fastest setting that keeps accuracy",
                  configure, run, stopped=kept_rows)
