"""``semverify compare``: several methods on the same benchmark problems, resumable."""

from __future__ import annotations

import argparse
from pathlib import Path

from evals.benchmarks import get_benchmark
from evals.report import report
from evals.runner import RunSettings, compare, shard_info
from semverify.commands import Command, positive_int
from semverify.models import ModelLoadError, load_tokenizer
from semverify.registry import available_methods, load_methods

from .common import add_models


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default="vanilla,sd,pld,typical",
                   help="comma-separated built-in methods, each optionally name:key=value,... (built-ins: "
                        + ", ".join(available_methods()) + ")")
    p.add_argument("--config", action="append", default=None,
                   help='JSON file {"methods": [{name, drafter, rule, rule_params, k}]}; repeat to combine files')
    add_models(p)
    p.add_argument("--benchmark", default="gsm8k")
    p.add_argument("--data", default="auto", help="'auto' (the shipped dev problems), 'sample', a jsonl path or 'hub'")
    p.add_argument("--template", default="chat", choices=["chat", "fewshot"])
    p.add_argument("--limit", type=positive_int, default=50)
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--do-sample", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--datastore", default=None,
                   help="datastore file for the retrieval methods (rest, dresd, sense, ...); see `semverify "
                        "datastore`. A method may name its own: sense:drafter.datastore=FILE")
    p.add_argument("--out", required=True, help="run folder; rerun the same command to resume")
    p.add_argument("--no-report", action="store_true", help="skip writing the report at the end")


def run(args: argparse.Namespace) -> int:
    settings = RunSettings(
        target=args.target, draft=args.draft, dtype=args.dtype, benchmark=args.benchmark, data=args.data,
        template=args.template, limit=args.limit, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, datastore=args.datastore,
    )
    # every input error surfaces here, before a model is loaded
    get_benchmark(args.benchmark).load(args.data, args.limit)
    try:
        tokenizer = load_tokenizer(args.target)
    except ModelLoadError:
        tokenizer = None  # methods are checked without it; loading the target then reports the problem
    methods = load_methods(args.methods, args.config, settings.context(tokenizer))
    storeless = [m.name for m in methods if m.retrieves and m.datastore(args.datastore) is None]
    if storeless:
        raise ValueError(f"methods {', '.join(storeless)} draft by retrieval and need --datastore FILE "
                         "(build one with `semverify datastore`) or their own drafter.datastore=FILE")
    for path in {m.datastore(args.datastore) for m in methods} - {None}:
        if not Path(path).is_file():
            raise FileNotFoundError(f"datastore not found: {path}")
    out = compare(settings, methods, args.out)
    if not args.no_report and shard_info() == (0, 1):
        print(report(out))
    return 0


COMMAND = Command("compare", "run several methods on the same benchmark problems (resumable)", configure, run)
