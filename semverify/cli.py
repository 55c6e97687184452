"""Command line: ``semverify generate`` runs one prompt and prints the text and the statistics."""

from __future__ import annotations

import argparse
from dataclasses import asdict
import json
import shlex
import sys
from pathlib import Path

import torch

from .models import DEFAULT_DRAFT, DEFAULT_TARGET, OFFLINE_MODELS
from .rules import available_rules, parse_param, run_context


def _rule_param(text: str) -> tuple[str, object]:
    try:
        return parse_param(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semverify", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="speculative decoding of one prompt")
    gen.add_argument("prompt", help="the user message (wrapped in the chat template unless --raw)")
    gen.add_argument("--target", default=DEFAULT_TARGET, help="alias, hub id, local folder or .gguf file")
    gen.add_argument("--draft", default=None, help="draft model (alias, hub id, folder or .gguf)")
    gen.add_argument("--prompt-lookup", type=int, default=None, metavar="K",
                     help="draft K tokens by prompt lookup instead of a draft model")
    gen.add_argument("--rule", default="speculative", choices=available_rules(), help="acceptance rule")
    gen.add_argument("--rule-param", type=_rule_param, action="append", default=[], metavar="KEY=VALUE",
                     help="rule constructor argument, e.g. posterior_threshold=0.09 or percentile=80 "
                          "(repeatable)")
    gen.add_argument("-k", "--num-draft-tokens", type=int, default=None, help="draft tokens per step (default 5)")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--do-sample", action="store_true")
    gen.add_argument("--temperature", type=float, default=None)
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", default="bfloat16", help="bfloat16 (fast) or float32 (exact)")
    gen.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    gen.add_argument("--json", action="store_true", help="print the statistics as JSON")

    cmp = sub.add_parser("compare", help="run several methods on the same benchmark problems (resumable)")
    cmp.add_argument("--methods", default="vanilla,sd,pld,typical",
                     help="comma-separated built-in methods, each optionally name:key=value,... "
                          "(built-ins: vanilla, draft_alone, sd, sd_int8, pld, typical, easd, semanticspec, rest, dresd, "
                          "sense, sense_no_sen, sense_no_se, fly)")
    cmp.add_argument("--config", action="append", default=None,
                     help='JSON file {"methods": [{name, drafter, rule, rule_params, k}]}; repeat to combine files')
    cmp.add_argument("--target", default=DEFAULT_TARGET)
    cmp.add_argument("--draft", default=DEFAULT_DRAFT)
    cmp.add_argument("--benchmark", default="gsm8k")
    cmp.add_argument("--data", default="auto", help="jsonl path, 'hub' (openai/gsm8k), 'sample' or 'auto'")
    cmp.add_argument("--template", default="chat", choices=["chat", "fewshot"])
    cmp.add_argument("--limit", type=int, default=50)
    cmp.add_argument("--max-new-tokens", type=int, default=256)
    cmp.add_argument("--do-sample", action="store_true")
    cmp.add_argument("--temperature", type=float, default=1.0)
    cmp.add_argument("--top-k", type=int, default=None)
    cmp.add_argument("--top-p", type=float, default=None)
    cmp.add_argument("--seed", type=int, default=0)
    cmp.add_argument("--dtype", default="bfloat16")
    cmp.add_argument("--datastore", default=None,
                     help="datastore file for the retrieval methods (rest, dresd, sense, ...); see `semverify datastore`. "
                          "A method may name its own: sense:drafter.datastore=FILE")
    cmp.add_argument("--out", required=True, help="run folder; rerun the same command to resume")
    cmp.add_argument("--no-report", action="store_true", help="skip writing the report at the end")

    rep = sub.add_parser("report", help="table, paired test and plots for a compare run folder")
    rep.add_argument("run_dir")
    rep.add_argument("--reference", default="vanilla", help="method speedups are measured against")
    rep.add_argument("--paired", default=None,
                     help="comma-separated methods to run the paired McNemar test against (default: the reference)")
    rep.add_argument("--grader", default="math_verify", choices=["strict", "flexible", "math_verify"])

    rpl = sub.add_parser("replay", help="tau of model-free drafters (pld, rest) on a greedy run's recorded outputs, "
                                        "without the target: compare datastores and drafter settings in seconds")
    rpl.add_argument("run_dir", help="a greedy `semverify compare` run folder")
    rpl.add_argument("--methods", default="pld,rest", help="model-free methods, with parameters as in compare")
    rpl.add_argument("--source", default="vanilla", help="the method whose outputs are replayed")
    rpl.add_argument("--datastore", default=None, help="datastore file for rest (else context lookup only)")
    rpl.add_argument("--cost", default=None,
                     help="cost.json from `python -m evals.forward_cost`: adds tau / forward cost, a speedup forecast")
    rpl.add_argument("--json", action="store_true", help="print the results as JSON")

    cal = sub.add_parser("calibrate", help="entropy percentiles of a model by teacher forcing (for easd)")
    cal.add_argument("--model", required=True, help="alias, hub id, local folder or .gguf file")
    cal.add_argument("--data", default="auto", help="GSM8K train jsonl path, 'hub' or 'auto'")
    cal.add_argument("--limit", type=int, default=200, help="number of train solutions (default 200)")
    cal.add_argument("--temperatures", default="1.0,0.7",
                     help="comma-separated decoding temperatures to calibrate for (greedy uses 1.0)")
    cal.add_argument("--dtype", default="bfloat16")
    cal.add_argument("--out", default=None, help="JSON path (default: the semverify cache, found by model name)")

    ds = sub.add_parser("datastore", help="build a SENSE datastore of the target's hidden states (resumable)")
    ds.add_argument("--model", default=DEFAULT_TARGET, help="the target model the datastore serves")
    ds.add_argument("--data", default="auto", help="GSM8K train jsonl path, 'hub' or 'auto'")
    ds.add_argument("--limit", type=int, default=2000, help="number of train problems (default 2000)")
    ds.add_argument("--corpus", default="ood", choices=["ood", "id", "both"],
                    help="ood: the reference solutions; id: the target's own greedy answers to the same "
                         "problems (generated first, resumable); both: the two together (default ood)")
    ds.add_argument("--answers", default=None,
                    help="JSONL of the target's answers for --corpus id/both (default OUT.answers.jsonl)")
    ds.add_argument("--batch-size", type=int, default=8, help="prompts per generate() batch for the ID answers")
    ds.add_argument("--max-new-tokens", type=int, default=384, help="answer length cap for the ID answers")
    ds.add_argument("--dim", type=int, default=256, help="PCA dimension of the keys")
    ds.add_argument("--dtype", default="bfloat16", help="use the dtype you will decode with")
    ds.add_argument("--out", required=True, help="datastore file (.pt); states go to OUT.parts/ so a rerun resumes")

    pr = sub.add_parser("probes", help="draw, label and train a matched pair of SemanticSpec probes (resumable)")
    pr.add_argument("--target", default=DEFAULT_TARGET, help="the target model (alias, hub id, folder or .gguf)")
    pr.add_argument("--draft", default=DEFAULT_DRAFT, help="the draft model")
    pr.add_argument("--data", default="auto", help="GSM8K train jsonl path, 'hub' or 'auto'")
    pr.add_argument("--problems", type=int, default=100,
                    help="train problems the models answer; even ones by the target, odd ones by the draft")
    pr.add_argument("--per-answer", type=int, default=3, help="prefixes cut from each answer at step ends")
    pr.add_argument("--samples", type=int, default=8, help="one-step samples per model and prefix (authors: 20)")
    pr.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (that of the runs served)")
    pr.add_argument("--max-step-tokens", type=int, default=128)
    pr.add_argument("--threshold", type=float, default=0.85, help="embedding cosine at which two steps mean the same")
    pr.add_argument("--ignore-numbers", action="store_true",
                    help="let steps with different results share a meaning (the embedding alone decides)")
    pr.add_argument("--dtype", default="bfloat16")
    pr.add_argument("--answer-batch", type=int, default=8, help="answers generated per batch")
    pr.add_argument("--work", required=True, help="folder for answers and samples; rerun the same command to resume")
    pr.add_argument("--out-dir", default=None,
                    help="where the two probes go (default: the semverify cache, found by model name)")
    pr.add_argument("--sample-only", action="store_true", help="draw the samples, do not label or train")

    sub.add_parser("rules", help="list the registered acceptance rules")
    sub.add_parser("models", help="list the offline model aliases")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = shlex.join(["semverify", *(sys.argv[1:] if argv is None else argv)])  # provenance
    if args.command == "rules":
        print("\n".join(available_rules()))
        return 0
    if args.command == "models":
        for alias, spec in OFFLINE_MODELS.items():
            print(f"{alias}\t{spec.pip_command}")
        return 0
    if args.command == "compare":
        return _compare(args)
    if args.command == "calibrate":
        return _calibrate(args)
    if args.command == "replay":
        return _replay(args)
    if args.command == "datastore":
        return _datastore(args)
    if args.command == "probes":
        return _probes(args)
    if args.command == "report":
        from evals.report import report

        paired = [m.strip() for m in args.paired.split(",") if m.strip()] if args.paired else None
        try:
            print(report(args.run_dir, args.reference, args.grader, paired))
        except (ValueError, FileNotFoundError) as err:
            sys.exit(f"semverify report: {err}")
        return 0
    return _generate(args)


def _compare(args: argparse.Namespace) -> int:
    from evals.benchmarks import get_benchmark
    from evals.methods import RETRIEVAL, load_methods
    from evals.report import report
    from evals.runner import RunSettings, compare, shard_info

    try:  # every input error surfaces here, before a model is loaded
        context = run_context(args.draft, args.target, args.do_sample, args.temperature)
        methods = load_methods(args.methods, args.config, context)
        retrieval = [m for m in methods if m.drafter in RETRIEVAL]
        storeless = [m.name for m in retrieval if m.datastore(args.datastore) is None]
        if storeless:
            raise ValueError(f"methods {', '.join(storeless)} draft by retrieval and need --datastore FILE "
                             "(build one with `semverify datastore`) or their own drafter.datastore=FILE")
        for path in {args.datastore, *(m.datastore(args.datastore) for m in retrieval)} - {None}:
            if not Path(path).is_file():
                raise FileNotFoundError(f"datastore not found: {path}")
        get_benchmark(args.benchmark).load(args.data, args.limit)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"semverify compare: {err}")
    settings = RunSettings(
        target=args.target, draft=args.draft, dtype=args.dtype, benchmark=args.benchmark, data=args.data,
        template=args.template, limit=args.limit, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, datastore=args.datastore,
    )
    out = compare(settings, methods, args.out)
    if not args.no_report and shard_info() == (0, 1):
        print(report(out))
    return 0


def _replay(args: argparse.Namespace) -> int:
    from evals.methods import load_methods
    from evals.replay import add_predicted_speedup, replay_run, replay_table

    from .sense import Datastore

    try:
        store = Datastore.load(args.datastore) if args.datastore else None
        results = replay_run(args.run_dir, load_methods(args.methods), store, args.source)
        if args.cost:
            add_predicted_speedup(results, args.cost)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"semverify replay: {err}")
    print(json.dumps(results, indent=2) if args.json else replay_table(results))
    return 0


def _model_and_train_answers(args: argparse.Namespace, limit: int):
    """``args.model`` and the first ``limit`` GSM8K train solutions as (prompt, answer) pairs in its template."""
    from evals.benchmarks import get_benchmark

    from .models import load_model

    model, tokenizer = load_model(args.model, dtype=args.dtype)
    try:
        return model, tokenizer, get_benchmark("gsm8k").worked_examples(tokenizer, args.data, limit)
    except FileNotFoundError as err:
        sys.exit(f"semverify {args.command}: {err}")


def _probes(args: argparse.Namespace) -> int:
    from evals.benchmarks import get_benchmark

    from .models import cache_root, load_model, model_key
    from .semanticspec import judges, labelling, training

    settings = labelling.LabelSettings(samples=args.samples, temperature=args.temperature,
                                       max_step_tokens=args.max_step_tokens, per_answer=args.per_answer)
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    draft, _ = load_model(args.draft, dtype=args.dtype)
    try:
        bench = get_benchmark("gsm8k")
        prompts = [bench.prompt(tokenizer, p) for p in bench.load(args.data, args.problems, split="train")]
        labelling.collect(target, draft, tokenizer, prompts, args.work, settings, args.answer_batch)
    except (FileNotFoundError, ValueError) as err:
        sys.exit(f"semverify probes: {err}")
    if args.sample_only:
        return 0
    judge = judges.meaning_judge(args.threshold, require_numbers=not args.ignore_numbers)
    data = training.label_samples(args.work, judge)
    draft_probe, target_probe, report = training.train_pair(data, args.draft, args.target)
    meta = {"judge": judge.__name__, "settings": asdict(settings),
            "dtype": args.dtype, "command": args.command_line, "problems": args.problems}
    out = Path(args.out_dir) if args.out_dir else cache_root() / "probes"
    paths = {}
    for probe, model in ((draft_probe, args.draft), (target_probe, args.target)):
        probe.meta.update(meta)
        paths[probe.meta["role"]] = str(probe.save(out / f"{model_key(model)}.pt"))
    report.update(probes=paths, **meta)
    (Path(args.work) / "probe_report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({"probes": paths, "pair": report["pair"], "held_out": report["test_draft_steps"],
                      "target_test": report["target_on_draft_steps"]["test"], "draft_test": report["draft"]["test"]},
                     indent=2))
    return 0


def _datastore(args: argparse.Namespace) -> int:
    from .sense import generate_answers, timed_build

    model, tokenizer, examples = _model_and_train_answers(args, args.limit)
    texts = []
    if args.corpus in ("ood", "both"):
        texts.append(f"the first {len(examples)} reference solutions (OOD)")
    if args.corpus in ("id", "both"):
        answers = args.answers or f"{args.out}.answers.jsonl"
        own = [(a.prompt, a.text) for a in generate_answers(model, tokenizer, [p for p, _ in examples], answers,
                                                             args.batch_size, args.max_new_tokens, desc="ID answers")]
        examples = (examples if args.corpus == "both" else []) + own
        texts.append(f"the target's greedy answers to the first {len(own)} problems, max {args.max_new_tokens} "
                     f"new tokens (ID, {answers})")
    _, info = timed_build(model, tokenizer, examples, args.out, args.dim, model_name=args.model,
                          corpus=f"gsm8k train ({args.data}): " + " + ".join(texts))
    print(json.dumps(info, indent=2))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from evals.benchmarks import SHARED_TRAIN

    from .easd import calibrate_entropy, calibration_path

    try:
        temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        sys.exit(f"semverify calibrate: --temperatures must be numbers, got {args.temperatures!r}")
    model, tokenizer, examples = _model_and_train_answers(args, args.limit)
    source = args.data
    if source == "auto":
        source = str(SHARED_TRAIN.name) if SHARED_TRAIN.is_file() else "hub"
    calib = calibrate_entropy(model, tokenizer, examples, temperatures, model_name=args.model,
                              corpus=f"gsm8k train ({source}), first {len(examples)} solutions, chat template")
    path = calib.save(args.out or calibration_path(args.model))
    for t in calib.quantiles:
        print(f"T={t}: entropy p50={calib.threshold(50, float(t)):.3f} p80={calib.threshold(80, float(t)):.3f} "
              f"p90={calib.threshold(90, float(t)):.3f} nats over {calib.n_tokens} tokens")
    print(f"saved {path}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .generation import generate
    from .models import load_model
    from .rules import get_rule, with_context

    if args.draft and args.prompt_lookup:
        sys.exit("semverify: use --draft or --prompt-lookup, not both")
    context = run_context(args.draft, args.target, args.do_sample, args.temperature)
    try:
        rule = get_rule(args.rule, **with_context(args.rule, dict(args.rule_param), context))
    except (ValueError, TypeError, FileNotFoundError) as err:
        sys.exit(f"semverify generate: {err}")
    torch.manual_seed(args.seed)
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    draft = load_model(args.draft, dtype=args.dtype)[0] if args.draft else None
    if args.raw or not tokenizer.chat_template:
        text = args.prompt
    else:
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=False,
                                             add_generation_prompt=True)
    input_ids = tokenizer(text, return_tensors="pt").input_ids
    sampling = {k: v for k, v in (("temperature", args.temperature), ("top_k", args.top_k),
                                  ("top_p", args.top_p)) if v is not None}
    out = generate(
        target, input_ids, acceptance=rule, assistant_model=draft,
        prompt_lookup_num_tokens=args.prompt_lookup, num_assistant_tokens=args.num_draft_tokens,
        max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, return_dict_in_generate=True,
        tokenizer=tokenizer, **sampling,
    )
    print(tokenizer.decode(out.sequences[0, input_ids.shape[1]:], skip_special_tokens=True))
    stats = out.spec_stats
    print(json.dumps(stats.to_dict(), indent=2) if args.json else f"\n[semverify] {stats.summary()}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
