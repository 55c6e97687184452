"""``semverify calibrate``: a model's entropy percentiles by teacher forcing over GSM8K train answers (EASD)."""

from __future__ import annotations

import argparse

from evals.benchmarks import get_benchmark
from semverify.commands import Command
from semverify.easd import calibration_path
from semverify.easd.calibrate import calibrate_entropy
from semverify.models import load_model

from .common import add_train_data, train_examples


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="alias, hub id, local folder or .gguf file")
    add_train_data(p, 200, "solutions")
    p.add_argument("--temperatures", default="1.0,0.7",
                   help="comma-separated decoding temperatures to calibrate for (greedy uses 1.0)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=None, help="JSON path (default: the semverify cache, found by model name)")


def run(args: argparse.Namespace) -> int:
    try:
        temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}") from None
    source = get_benchmark("gsm8k").source_file(args.data, split="train")
    model, tokenizer = load_model(args.model, dtype=args.dtype)
    examples = train_examples(args, tokenizer)
    calib = calibrate_entropy(model, tokenizer, examples, temperatures, model_name=args.model,
                              corpus=f"gsm8k train ({source.name if source else 'hub'}), first {len(examples)} "
                                     "solutions, chat template")
    path = calib.save(args.out or calibration_path(args.model))
    for t in calib.quantiles:
        print(f"T={t}: entropy p50={calib.threshold(50, float(t)):.3f} p80={calib.threshold(80, float(t)):.3f} "
              f"p90={calib.threshold(90, float(t)):.3f} nats over {calib.n_tokens} tokens")
    print(f"saved {path}")
    return 0


COMMAND = Command("calibrate", "entropy percentiles of a model by teacher forcing (for easd)", configure, run)
