"""Arguments the harness's commands share, and the GSM8K train examples the offline builders use."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from evals.rows import read_rows
from semverify.commands import add_decoding_args, non_negative_int, positive_int
from semverify.engine.coupling import NOISE_KINDS
from semverify.models import DEFAULT_DRAFT, DEFAULT_TARGET
from semverify.plugins import add_plugin_option, load_plugins, loaded_plugins

if TYPE_CHECKING:
    from evals.runner import CheckedRun


def printed(benchmark: Callable[[argparse.Namespace], str]) -> Callable[[argparse.Namespace], int]:
    """A command that runs ``benchmark`` and prints the table it returns."""
    def run(args: argparse.Namespace) -> int:
        print(benchmark(args))
        return 0

    return run


def names(text: str | None) -> list[str]:
    """A comma-separated list of method names, blanks dropped (``None`` or empty: none)."""
    return [m.strip() for m in text.split(",") if m.strip()] if text else []


def add_models(p: argparse.ArgumentParser, draft: bool = True, dtype: str | None = "bfloat16") -> None:
    """--target, --draft and --dtype (``dtype`` None: the command picks the default, said in its help)."""
    p.add_argument("--target", default=DEFAULT_TARGET, help="alias, hub id, local folder or .gguf file")
    if draft:
        p.add_argument("--draft", default=DEFAULT_DRAFT, help="draft model (alias, hub id, folder or .gguf)")
    default = f" (default {dtype})" if dtype else " (default bfloat16; float32 with --accuracy)"
    p.add_argument("--dtype", default=dtype, help="bfloat16, float32 (exact), ..., or fastest: per model, the dtype "
                   "that decodes fastest on this machine (measured once, cached; the choice is recorded)" + default)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cpu",
                   help="where the models run: cpu (default), cuda, cuda:N or mps (an int8 draft stays on the CPU, "
                        "so *_int8 methods need --device cpu)")


def add_train_data(p: argparse.ArgumentParser, limit: int, what: str) -> None:
    p.add_argument("--data", default="auto",
                   help="GSM8K train jsonl path, 'auto' (the train split shipped with semverify) or 'hub'")
    p.add_argument("--limit", type=positive_int, default=limit, help=f"number of train {what} (default {limit})")


def train_examples(args: argparse.Namespace, tokenizer) -> list[tuple[str, str]]:
    """The first ``args.limit`` GSM8K train solutions as (prompt, answer) pairs in the model's template."""
    from evals.benchmarks import get_benchmark

    return get_benchmark("gsm8k").worked_examples(tokenizer, args.data, args.limit)


def add_run_args(p: argparse.ArgumentParser, limit: int, dtype: str | None = "bfloat16") -> None:
    """The arguments of a compare run: models, problems, decoding, datastore and the run folder."""
    add_models(p, dtype=dtype)
    add_device(p)
    p.add_argument("--benchmark", default="gsm8k", help="gsm8k, math500 or humaneval")
    p.add_argument("--data", default="auto", help="'auto' (the shipped dev problems), 'sample', a jsonl path or 'hub'")
    p.add_argument("--template", default="chat", help="chat (zero-shot) or fewshot (GSM8K only)")
    p.add_argument("--limit", type=positive_int, default=limit, help=f"problems to run (default {limit})")
    p.add_argument("--offset", type=non_negative_int, default=None,
                   help="start at this problem (default 0), e.g. to choose settings on problems the final table "
                        "does not use")
    add_decoding_args(p, max_new_tokens=256, temperature=1.0)
    p.add_argument("--samples", type=positive_int, default=None,
                   help="with --do-sample: outputs per problem and method, each with its own seed derived from the "
                        "problem's (accuracy is then the mean of per-problem pass rates)")
    p.add_argument("--coupled", action="store_const", const=True, default=None,
                   help="with --do-sample: draw every target token as the Gumbel-max under noise keyed by (problem "
                        "seed, position), the same for every method, so lossless methods equal vanilla token for "
                        "token and a lossy rule differs only where it decides otherwise (paired comparisons)")
    p.add_argument("--coupled-context", type=positive_int, default=None, metavar="N",
                   help="with --coupled: key the noise by the last N tokens (and how often they occurred before) "
                        "instead of the position, so a lossy rule's output can join the reference's text again "
                        "after it changed a token (see docs/harness.md)")
    p.add_argument("--coupled-noise", choices=NOISE_KINDS, default=None,
                   help="with --coupled: how each key becomes noise: 'counter' (hashed on the device, batched; new "
                        "runs) or 'legacy' (the CPU generator the runs before 2026-12-07 used, as "
                        "results/gsm8k-500); a resumed run keeps what it started with")
    p.add_argument("--datastore", default=None,
                   help="datastore file for the retrieval methods (rest, dresd, sense, ...); see `semverify "
                        "datastore`. A method may name its own: sense:drafter.datastore=FILE")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="problems decoded together per method (default 1); speedups are then ratios of total "
                        "tokens/s, since a problem's time includes its batch's")
    p.add_argument("--out", required=True, help="run folder; rerun the same command to resume")
    p.add_argument("--repin", action="store_true",
                   help="resume although a method's datastore, calibration or probe file changed since the run "
                        "started (e.g. a store rebuilt on another machine), or a --plugin's source changed; "
                        "run.json records both hashes")
    add_plugin_option(p)


def checked_run(args: argparse.Namespace, methods: str | None, configs: list[str] | None,
                only: str | None = None) -> CheckedRun:
    """The run of a command's arguments, checked and built once, every input error raised before a model loads."""
    from evals.provenance import RunSettings
    from evals.runner import CheckedRun
    from semverify.engine.coupling import COUPLING_VERSION

    load_plugins(args.plugin, "--plugin")
    settings = RunSettings(
        target=args.target, draft=args.draft, dtype=args.dtype, benchmark=args.benchmark, data=args.data,
        template=args.template, limit=args.limit, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, datastore=args.datastore,
        offset=args.offset, batch_size=args.batch_size, coupled=args.coupled, coupled_context=args.coupled_context,
        coupled_noise=coupled_noise(args), samples=args.samples if args.samples != 1 else None,
        coupling=COUPLING_VERSION if args.coupled else None,
    )
    if args.coupled_context and not args.coupled:
        raise ValueError("--coupled-context N keys coupled noise by context; add --coupled")
    if (args.samples or 1) > 1 and not args.do_sample:
        raise ValueError("--samples draws several outputs per problem; add --do-sample (greedy outputs repeat)")
    if args.coupled and not args.do_sample:
        raise ValueError("--coupled couples sampled runs; add --do-sample (greedy runs are paired already)")
    try:
        return CheckedRun.build(settings, methods, configs, only, device=args.device)
    except ValueError as err:
        hint = plugin_hint(args.out)
        raise ValueError(f"{err}; {hint}" if hint else str(err)) from err


def coupled_noise(args: argparse.Namespace) -> str | None:
    """The run's coupled noise: as asked, else what the run in ``--out`` started with (a run from before the
    choice existed: None, the legacy noise), else counter noise for a new coupled run."""
    from evals.provenance import recorded

    if not args.coupled:
        if args.coupled_noise:
            raise ValueError("--coupled-noise chooses the noise of a coupled run; add --coupled")
        return None
    if args.coupled_noise:
        return args.coupled_noise
    started = recorded(Path(args.out), "settings")
    return started.get("coupled_noise") if started is not None else "counter"


def plugin_hint(run_dir: str) -> str:
    """What to do when the run in ``run_dir`` was started with plugins this process has not loaded (their
    methods, rules and drafters are unknown here); empty otherwise."""
    from evals.provenance import recorded

    try:
        pinned = recorded(Path(run_dir), "pins") or {}
    except (OSError, ValueError):
        return ""
    loaded = {p.module for p in loaded_plugins()}
    missing = [p for p in pinned.get("plugins", []) if p["module"] not in loaded]
    if not missing:
        return ""
    how = ", ".join(f"install {p['package']}" if p.get("package") else
                    f"pass --plugin {p['file'] if p['name'].endswith('.py') else p['name']}" for p in missing)
    return f"the run in {run_dir} was started with plugins that are not loaded now: {how}"


def kept_rows(args: argparse.Namespace) -> str:
    """What a stopped run over ``--out`` kept (`Command.stopped`): its rows, and how to go on."""
    rows = len(read_rows(args.out)) if Path(args.out).is_dir() else 0
    return f"{rows} rows kept in {args.out}; rerun the same command to resume"
