"""Subcommands of the ``semverify`` command line, and the rules they share.

A command is a name, a help line, a function that adds its arguments and one that runs it. The library
has its own (``generate``, ``rules``, ``models``); other packages add theirs under the entry-point
group ``semverify.commands`` (the evaluation harness registers ``compare``, ``report`` and the
others), so the library never imports them. Bad input ends a command with one line on stderr that
names the argument or file and what to do, and exit status 2; ``--debug`` shows the traceback instead. Ctrl-C
ends a command with one line saying what it kept and how to resume (``Command.stopped``), and exit status 130.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from .models import ModelPackageMissing

GROUP = "semverify.commands"
# what bad input raises; other exceptions are bugs and keep their traceback
USER_ERRORS = (ValueError, FileNotFoundError, NotImplementedError, ModelPackageMissing)


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]
    passthrough: bool = False  # hands its arguments to another program unparsed (``args.rest``)
    stopped: Callable[[argparse.Namespace], str] | None = None  # after Ctrl-C: what the run kept, how to go on


INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C (128 + SIGINT)


class CommandFailed(SystemExit):
    """A command stopped on bad input: exit status 2, and ``str()`` is the one-line message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = 2


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _at_least(text, 1)


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _at_least(text, 0)


def key_value(text: str) -> tuple[str, object]:
    """argparse type: ``key=value`` with the value typed (int, float, bool or str)."""
    from .registry import parse_param

    try:
        return parse_param(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_decoding_args(p: argparse.ArgumentParser, max_new_tokens: int, temperature: float | None) -> None:
    """The decoding options every generating command shares, with what each does and its default."""
    p.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens,
                   help=f"new tokens at most per output (default {max_new_tokens})")
    p.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding (default greedy)")
    shown = "the model's generation config" if temperature is None else temperature
    p.add_argument("--temperature", type=float, default=temperature,
                   help=f"with --do-sample: the sampling temperature (default {shown})")
    p.add_argument("--top-k", type=int, default=None,
                   help="with --do-sample: keep the k most likely tokens only (default: no cut)")
    p.add_argument("--top-p", type=float, default=None,
                   help="with --do-sample: keep the smallest set of tokens with this much mass (default: no cut)")
    p.add_argument("--seed", type=int, default=0,
                   help="the random seed (default 0; a benchmark run derives one per problem from it)")
