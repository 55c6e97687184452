"""``semverify calibrate``: a model's entropy percentiles by teacher forcing over GSM8K train answers (EASD)."""

from __future__ import annotations

import argparse

from evals.benchmarks import get_benchmark
from semverify.answers import generate_answers
from semverify.commands import Command, positive_int
from semverify.easd import calibration_path
from semverify.easd.calibrate import calibrate_entropy
from semverify.models import load_model

from .common import add_train_data, train_examples


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="alias, hub id, local folder or .gguf file")
    add_train_data(p, 200, "solutions")
    p.add_argument("--temperatures", default="1.0,0.7",
                   help="comma-separated decoding temperatures to calibrate for (greedy uses 1.0)")
    p.add_argument("--corpus", default="ood", choices=["ood", "id"],
                   help="ood: GSM8K's reference solutions; id: the model's own greedy answers to the same problems "
                        "(generated first, resumable), the text it is uncertain about when it decodes")
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts per batch for the id answers")
    p.add_argument("--max-new-tokens", type=positive_int, default=384, help="answer length cap for the id answers")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default=None,
                   help="JSON path (default: the semverify cache, found by model name; an id calibration is saved as "
                        "MODEL-id.json, for easd's draft_calibration/target_calibration)")


def run(args: argparse.Namespace) -> int:
    try:
        temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}") from None
    source = get_benchmark("gsm8k").source_file(args.data, split="train")
    model, tokenizer = load_model(args.model, dtype=args.dtype)
    examples = train_examples(args, tokenizer)
    corpus = f"gsm8k train ({source.name if source else 'hub'}), first {len(examples)} solutions, chat template"
    out = args.out or calibration_path(args.model)
    if args.corpus == "id":
        out = args.out or calibration_path(args.model).with_name(f"{calibration_path(args.model).stem}-id.json")
        answers = generate_answers(model, tokenizer, [p for p, _ in examples], f"{out}.answers.jsonl",
                                   args.batch_size, args.max_new_tokens, desc="own answers")
        examples = [(a.prompt, a.text) for a in answers]
        corpus = (f"the model's own greedy answers (max {args.max_new_tokens} new tokens) to the first "
                  f"{len(examples)} gsm8k train problems, chat template")
    calib = calibrate_entropy(model, tokenizer, examples, temperatures, model_name=args.model, corpus=corpus)
    path = calib.save(out)
    for t in calib.quantiles:
        print(f"T={t}: entropy p50={calib.threshold(50, float(t)):.3f} p80={calib.threshold(80, float(t)):.3f} "
              f"p90={calib.threshold(90, float(t)):.3f} nats over {calib.n_tokens} tokens")
    print(f"saved {path}")
    return 0


COMMAND = Command("calibrate", "entropy percentiles of a model by teacher forcing (for easd)", configure, run)
