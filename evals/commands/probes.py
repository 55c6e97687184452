"""``semverify probes``: draw, label and train a matched pair of SemanticSpec probes (resumable)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from evals.benchmarks import get_benchmark
from semverify.commands import Command, non_negative_int, positive_int
from semverify.model_cache import cache_root
from semverify.models import load_model
from semverify.semanticspec import judges, labelling, pair_key, training

from .common import add_models


def configure(p: argparse.ArgumentParser) -> None:
    add_models(p)
    p.add_argument("--data", default="auto", help="GSM8K train jsonl path, 'auto' (shipped) or 'hub'")
    p.add_argument("--problems", type=positive_int, default=100,
                   help="train problems the models answer; even ones by the target, odd ones by the draft")
    p.add_argument("--per-answer", type=positive_int, default=3, help="prefixes cut from each answer at step ends")
    p.add_argument("--samples", type=positive_int, default=8,
                   help="one-step samples per model and prefix (authors: 20)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (that of the runs served)")
    p.add_argument("--max-step-tokens", type=positive_int, default=128)
    p.add_argument("--threshold", type=float, default=0.85, help="embedding cosine at which two steps mean the same")
    p.add_argument("--ignore-numbers", action="store_true",
                   help="let steps with different results share a meaning (the embedding alone decides)")
    p.add_argument("--answer-batch", type=positive_int, default=8, help="answers generated per batch")
    p.add_argument("--group", type=positive_int, default=4, help="prefixes sampled per batch")
    p.add_argument("--work", required=True, help="folder for answers and samples; rerun the same command to resume")
    p.add_argument("--out-dir", default=None,
                   help="where the pair's folder of probes goes (default: the semverify cache, where the rule finds "
                        "them by the models' names)")
    p.add_argument("--folds", type=non_negative_int, default=5,
                   help="cross-validation folds by prefix for the out-of-fold signal AUROCs (0: skip)")
    stage = p.add_mutually_exclusive_group()
    stage.add_argument("--sample-only", action="store_true", help="draw the samples, do not label or train")
    stage.add_argument("--train-only", action="store_true",
                       help="label and train on the samples drawn so far (to stop a long draw early); loads no "
                            "language model")


def run(args: argparse.Namespace) -> int:
    draw_path = Path(args.work) / "draw.json"  # how the samples were drawn, for the probes' metadata
    if args.train_only:
        settings = labelling.drawn_settings(args.work)
        draw = json.loads(draw_path.read_text()) if draw_path.is_file() else {"dtype": None, "problems": None}
    else:
        draw = {"dtype": args.dtype, "problems": args.problems}
        settings = labelling.LabelSettings(samples=args.samples, temperature=args.temperature,
                                           max_step_tokens=args.max_step_tokens, per_answer=args.per_answer)
        bench = get_benchmark("gsm8k")
        problems = bench.load(args.data, args.problems, split="train")  # a bad data file fails before models load
        target, tokenizer = load_model(args.target, dtype=args.dtype)
        draft, _ = load_model(args.draft, dtype=args.dtype)
        prompts = [bench.prompt(tokenizer, p) for p in problems]
        draw_path.parent.mkdir(parents=True, exist_ok=True)
        draw_path.write_text(json.dumps(draw))
        labelling.collect(target, draft, tokenizer, prompts, args.work, settings, args.answer_batch, args.group)
    if args.sample_only:
        return 0
    judge = judges.meaning_judge(args.threshold, require_numbers=not args.ignore_numbers)
    data = training.label_samples(args.work, judge)
    draft_probe, target_probe, report = training.train_pair(data, args.draft, args.target)
    report["cross_validated"] = training.cross_validate(data, args.folds) if args.folds else None
    meta = {"judge": judge.__name__, "settings": asdict(settings), **draw, "command": args.command_line}
    out = (Path(args.out_dir) if args.out_dir else cache_root() / "probes") / pair_key(args.draft, args.target)
    paths = {}
    for probe in (draft_probe, target_probe):
        probe.meta.update(meta)
        paths[probe.meta["role"]] = str(probe.save(out / f"{probe.meta['role']}.pt"))
    report.update(probes=paths, **meta)
    (Path(args.work) / "probe_report.json").write_text(json.dumps(report, indent=2))
    (Path(args.work) / "probe_report.md").write_text(training.report_markdown(report))
    print(json.dumps({"probes": paths, "pair": report["pair"], "held_out": report["test_draft_steps"],
                      "target_test": report["target_on_draft_steps"]["test"], "draft_test": report["draft"]["test"]},
                     indent=2))
    return 0


COMMAND = Command("probes", "draw, label and train a matched pair of SemanticSpec probes (resumable)", configure, run,
                  stopped=lambda args: f"what was done is kept in {args.work}; rerun the same command to resume")
