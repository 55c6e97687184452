"""``semverify lm-eval ...``: lm-evaluation-harness's own command line with semverify's model and the
offline tasks over the shipped data (``semverify_gsm8k``, ``semverify_math500``)."""

from __future__ import annotations

import argparse
import sys

import torch

from evals.lm_eval_tasks import write_tasks
from semverify.commands import Command
from semverify.model_cache import cache_root


def configure(p: argparse.ArgumentParser) -> None:
    p.epilog = ("Everything after `lm-eval` goes to lm-eval's `run`, e.g. semverify lm-eval --model_args "
                "pretrained=qwen2.5-coder-1.5b-instruct,assistant_model=qwen2.5-coder-0.5b-instruct,rule=speculative "
                "--tasks semverify_gsm8k --limit 10 --output_path runs/lm-eval")


def lm_eval_argv(rest: list[str], tasks: str) -> list[str]:
    """lm-eval ``run`` arguments: the model ``semverify`` unless one is named, the CPU when no GPU is there,
    the offline tasks' folder on the include path, and semverify's statistics beside ``--output_path``."""
    argv = list(rest)
    if "--model" not in argv:
        argv = ["--model", "semverify", *argv]
    if "--device" not in argv and not torch.cuda.is_available():  # lm-eval's default device is cuda
        argv += ["--device", "cpu"]
    if "--include_path" in argv:
        i = argv.index("--include_path") + 1
        argv[i] = f"{argv[i]}:{tasks}"
    else:
        argv += ["--include_path", tasks]
    if "--output_path" in argv and "--model_args" in argv:
        i = argv.index("--model_args") + 1
        if "stats_path=" not in argv[i]:
            output = argv[argv.index("--output_path") + 1]
            argv[i] += f",stats_path={output.rstrip('/')}/semverify_stats.json"
    return argv


def run(args: argparse.Namespace) -> int:
    try:
        from lm_eval._cli import HarnessCLI

        import semverify.lm_eval  # noqa: F401  (registers the model "semverify" with lm-eval)
    except ImportError as err:
        raise ValueError(f"lm-eval is not installed ({err}); pip install 'semverify[lm-eval]'") from None
    tasks = str(write_tasks(cache_root() / "lm_eval_tasks"))
    cli = HarnessCLI()
    saved, sys.argv = sys.argv, ["lm-eval", "run", *lm_eval_argv(args.rest, tasks)]
    try:
        cli.execute(cli.parse_args())
    finally:
        sys.argv = saved
    return 0


COMMAND = Command("lm-eval", "lm-evaluation-harness with semverify's model and offline GSM8K/MATH-500 tasks",
                  configure, run, passthrough=True)
