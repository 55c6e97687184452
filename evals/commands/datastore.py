"""``semverify datastore``: a SENSE datastore of the target's hidden states over GSM8K train text (resumable)."""

from __future__ import annotations

import argparse
import json

from semverify.answers import generate_answers
from semverify.commands import Command, positive_int
from semverify.models import DEFAULT_TARGET, load_model
from semverify.sense import timed_build

from .common import add_train_data, train_examples


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_TARGET, help="the target model the datastore serves")
    add_train_data(p, 2000, "problems")
    p.add_argument("--corpus", default="ood", choices=["ood", "id", "both"],
                   help="ood: the reference solutions; id: the target's own greedy answers to the same "
                        "problems (generated first, resumable); both: the two together (default ood)")
    p.add_argument("--answers", default=None,
                   help="JSONL of the target's answers for --corpus id/both (default OUT.answers.jsonl)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts per generate() batch for the ID answers")
    p.add_argument("--max-new-tokens", type=positive_int, default=384, help="answer length cap for the ID answers")
    p.add_argument("--dim", type=positive_int, default=256, help="PCA dimension of the keys")
    p.add_argument("--dtype", default="bfloat16", help="use the dtype you will decode with")
    p.add_argument("--out", required=True, help="datastore file (.pt); states go to OUT.parts/ so a rerun resumes")


def run(args: argparse.Namespace) -> int:
    model, tokenizer = load_model(args.model, dtype=args.dtype)
    examples = train_examples(args, tokenizer)
    texts = []
    if args.corpus in ("ood", "both"):
        texts.append(f"the first {len(examples)} reference solutions (OOD)")
    if args.corpus in ("id", "both"):
        path = args.answers or f"{args.out}.answers.jsonl"
        own = [(a.prompt, a.text) for a in generate_answers(model, tokenizer, [p for p, _ in examples], path,
                                                             args.batch_size, args.max_new_tokens, desc="ID answers")]
        examples = (examples if args.corpus == "both" else []) + own
        texts.append(f"the target's greedy answers to the first {len(own)} problems, max {args.max_new_tokens} "
                     f"new tokens (ID, {path})")
    _, info = timed_build(model, tokenizer, examples, args.out, args.dim, model_name=args.model,
                          corpus=f"gsm8k train ({args.data}): " + " + ".join(texts))
    print(json.dumps(info, indent=2))
    return 0


COMMAND = Command("datastore", "build a SENSE datastore of the target's hidden states (resumable)", configure, run,
                  stopped=lambda args: f"the texts done are kept in {args.out}.parts; rerun the same command to resume")
