"""Arguments the harness's commands share, and the GSM8K train examples the offline builders use."""

from __future__ import annotations

import argparse

from semverify.commands import positive_int
from semverify.models import DEFAULT_DRAFT, DEFAULT_TARGET


def add_models(p: argparse.ArgumentParser, draft: bool = True, dtype: str = "bfloat16") -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="alias, hub id, local folder or .gguf file")
    if draft:
        p.add_argument("--draft", default=DEFAULT_DRAFT, help="draft model (alias, hub id, folder or .gguf)")
    p.add_argument("--dtype", default=dtype, help="bfloat16, float32, ...")


def add_train_data(p: argparse.ArgumentParser, limit: int, what: str) -> None:
    p.add_argument("--data", default="auto",
                   help="GSM8K train jsonl path, 'auto' (the train split shipped with semverify) or 'hub'")
    p.add_argument("--limit", type=positive_int, default=limit, help=f"number of train {what} (default {limit})")


def train_examples(args: argparse.Namespace, tokenizer) -> list[tuple[str, str]]:
    """The first ``args.limit`` GSM8K train solutions as (prompt, answer) pairs in the model's template."""
    from evals.benchmarks import get_benchmark

    return get_benchmark("gsm8k").worked_examples(tokenizer, args.data, args.limit)
