"""``semverify speed``: semverify's loop against transformers' assisted generation and prompt lookup."""

from __future__ import annotations

import argparse

from evals.speed import METHODS, run_speed
from semverify.commands import Command, positive_int

from .common import add_models, printed


def configure(p: argparse.ArgumentParser) -> None:
    add_models(p)
    p.add_argument("--data", default="auto", help="'auto' (the shipped dev problems), 'sample', a jsonl path or 'hub'")
    p.add_argument("--limit", type=positive_int, default=10)
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--k", type=positive_int, default=5, help="semverify draft tokens per step")
    p.add_argument("--pld-tokens", type=positive_int, default=10, help="prompt lookup tokens per step (both libraries)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--out", default="results/speed")


COMMAND = Command("speed", "speed benchmark against transformers' assisted generation (greedy, resumable)",
                  configure, printed(run_speed))
