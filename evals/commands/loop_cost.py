"""``semverify loop-cost``: the loop's host bookkeeping per step against transformers' plain decoding step."""

from __future__ import annotations

import argparse

from evals.loop_cost import BATCHES, PROMPTS, QWEN_VOCAB, run_loop_cost
from semverify.commands import Command, positive_int

from .common import add_device, printed


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny",
                   help="tiny (two tiny random Qwen2s with the real Qwen vocabulary, built from config; default), "
                        "pair (the default offline pair), or a hub id / local folder")
    p.add_argument("--draft", default=None, help="with a hub id or folder as --model: its draft model (default none)")
    p.add_argument("--dtype", default="float32", help="dtype of pair / hub models (default float32)")
    p.add_argument("--random-weights", action="store_true",
                   help="build --model and --draft from their config.json with random weights (costs only)")
    p.add_argument("--vocab", type=positive_int, default=QWEN_VOCAB, help="the tiny models' vocabulary size")
    add_device(p)
    p.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes")
    p.add_argument("--prompts", default=",".join(map(str, PROMPTS)), help="prompt lengths (random tokens)")
    p.add_argument("--new-tokens", type=positive_int, default=80, help="new tokens per row (a multiple of k + 1)")
    p.add_argument("--draft-tokens", type=positive_int, default=None,
                   help="new tokens per row in the draft model's runs (default 2 (k + 1): with random weights a "
                        "step keeps about one token, so a run is that many steps)")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed runs of every method per cell")
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per step")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--keep-large-buffers", action="store_true",
                   help="let glibc's malloc reuse freed buffers above 32 MB (semverify.machine.keep_large_buffers): "
                        "a batch's verify logits are above it, so by default each step maps fresh pages")
    p.add_argument("--out", default="results/loop-cost", help="folder for the tables (default results/loop-cost)")


COMMAND = Command("loop-cost", "the loop's bookkeeping per step (perfect drafter) against transformers' plain step",
                  configure, printed(run_loop_cost))
