"""``semverify speed``: semverify's methods against transformers' assisted generation and prompt lookup."""

from __future__ import annotations

import argparse

from evals.speed import METHODS, run_speed
from evals.timing import HF_METHODS
from semverify.commands import Command, positive_int

from .common import add_device, add_models, printed


def configure(p: argparse.ArgumentParser) -> None:
    add_models(p)
    add_device(p)
    p.add_argument("--data", default="auto", help="'auto' (the shipped dev problems), 'sample', a jsonl path or 'hub'")
    p.add_argument("--limit", type=positive_int, default=10, help="problems to time (default 10)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--k", type=positive_int, default=None,
                   help="draft tokens per step of semverify's draft-model methods (default: each preset's own)")
    p.add_argument("--pld-tokens", type=positive_int, default=10, help="prompt lookup tokens per step (both libraries)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="method presets, PRESET_int8 (on the int8 draft) and transformers' " + ", ".join(HF_METHODS)
                        + "; hf_vanilla is the baseline")
    p.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    p.add_argument("--out", default="results/speed", help="folder for the tables (default results/speed)")


COMMAND = Command("speed", "speed benchmark against transformers' assisted generation (greedy, resumable)",
                  configure, printed(run_speed))
