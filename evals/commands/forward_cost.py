"""``semverify forward-cost``: the target's verification forward time against its number of draft tokens."""

from __future__ import annotations

import argparse

from evals.forward_cost import SIZES, run_forward_cost
from semverify.commands import Command, positive_int

from .common import add_device, add_models, printed


def configure(p: argparse.ArgumentParser) -> None:
    add_models(p, draft=False)
    add_device(p)
    p.add_argument("--context", type=positive_int, default=300, help="cached tokens before the draft (prompt + answer)")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="draft token counts to time")
    p.add_argument("--repeats", type=positive_int, default=7, help="timed forwards per cell (default 7)")
    p.add_argument("--out", default="results/forward-cost", help="folder for the tables (default results/forward-cost)")


COMMAND = Command("forward-cost", "time one verification forward against its number of draft tokens", configure,
                  printed(run_forward_cost))
