"""``semverify throughput``: total tokens/s at several batch sizes, the target alone beside speculative decoding."""

from __future__ import annotations

import argparse

from evals.throughput import METHODS, run_throughput
from semverify.commands import Command, positive_int

from .common import add_device, add_models, printed


def configure(p: argparse.ArgumentParser) -> None:
    add_models(p)
    add_device(p)
    p.add_argument("--data", default="auto", help="'auto' (the shipped dev problems), 'sample', a jsonl path or 'hub'")
    p.add_argument("--prompts", type=positive_int, default=8, help="prompts, a multiple of the largest batch size")
    p.add_argument("--batch-sizes", default="1,2,4,8", help="comma-separated batch sizes (default 1,2,4,8)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--k", type=positive_int, default=None,
                   help="draft tokens per step of the draft-model methods (default: each preset's own)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="method presets that batch, and transformers' hf_vanilla; vanilla is the baseline")
    p.add_argument("--out", default="results/batch", help="folder for the tables (default results/batch)")


COMMAND = Command("throughput", "total tokens/s at several batch sizes: the target alone against speculative decoding",
                  configure, printed(run_throughput))
