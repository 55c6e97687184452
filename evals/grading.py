"""Answer graders reported side by side, so a score never hides how the answer was read out of the text.

GSM8K: strict (the number in the answer's explicit marker: "Final Answer:", the last \\boxed{}, or
"####"), flexible (the last number, as lm-evaluation-harness's flexible-extract), Math-Verify, and
program-run (an answer written as a Python program graded by the number the program prints when run, sandboxed:
coder models often write one and then make up its output; prose answers keep their Math-Verify grade).
MATH-500: the last \\boxed{} compared as a normalised string, and Math-Verify against the gold LaTeX.
HumanEval: pass@1, the answer's code run against the problem's tests in a sandboxed process.
"""

from __future__ import annotations

import functools
import logging
import re
from decimal import Decimal

from math_verify import parse, verify

# timeouts are off on purpose (see grade_math_verify); its warning about that on every call is noise
logging.getLogger("math_verify").setLevel(logging.ERROR)

GRADERS = ("strict", "flexible", "math_verify", "program_run")

# An ASCII number as written in an answer: optional minus (not a hyphen inside a word or range like
# "10-3"), optional "$", digits with well-formed thousands commas or none, optional decimals.
_NUMBER = r"(?:(?<!\w)-)?\$?(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?"
_NUMBER_RE = re.compile(_NUMBER)
# "Final Answer:" in any case, with markdown bold around the label or the number ("**Final Answer:** 72").
_FINAL_ANSWER_RE = re.compile(rf"final\s+answer[\s*]*:[\s*]*({_NUMBER})", re.IGNORECASE)
_HASHES_RE = re.compile(rf"####[\s*]*({_NUMBER})")
_BOXED_NUMBER_RE = re.compile(rf"\\boxed\{{\s*\\?({_NUMBER})\s*\}}")
_CANONICAL_RE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)")


def normalize_number(text: str) -> str | None:
    """Canonical decimal string ("$1,234." -> "1234", "7.0" -> "7") so equal numbers compare equal; None if not one."""
    cleaned = text.replace("$", "").replace(",", "").strip().removesuffix(".")
    if not _CANONICAL_RE.fullmatch(cleaned):
        return None
    value = Decimal(cleaned)
    if value.is_zero():
        return "0"
    digits = format(value, "f")  # exact, never exponent notation
    return digits.rstrip("0").rstrip(".") if "." in digits else digits


def extract_strict(output: str) -> str | None:
    """Normalized number after the last "Final Answer:" (the format the prompt asks for), else in the last
    \\boxed{} (the format the Qwen models write anyway), else after "####": only an answer marker scores."""
    for pattern in (_FINAL_ANSWER_RE, _BOXED_NUMBER_RE, _HASHES_RE):
        matches = pattern.findall(output)
        if matches:
            return normalize_number(matches[-1])
    return None


def extract_flexible(output: str) -> str | None:
    """Normalized last number in the text, as lm-eval's "flexible-extract", to credit loosely formatted answers."""
    matches = _NUMBER_RE.findall(output)
    return normalize_number(matches[-1]) if matches else None


def grade_math_verify(output: str, gold: str) -> bool:
    """Math-Verify's verdict, signal timeouts off so it runs in any thread; its errors grade False."""
    try:
        return verify(parse(gold, parsing_timeout=None), parse(output, parsing_timeout=None), timeout_seconds=None)
    except Exception:
        return False


def grade(output: str, gold: str) -> dict[str, bool]:
    """Correctness of a GSM8K ``output`` under every grader in ``GRADERS``, so results report them side by side."""
    expected = normalize_number(gold)
    strict, flexible = extract_strict(output), extract_flexible(output)
    math_verify = grade_math_verify(output, gold)
    return {
        "strict": expected is not None and strict == expected,
        "flexible": expected is not None and flexible == expected,
        "math_verify": math_verify,
        "program_run": grade_program_run(output, gold, math_verify),
    }


# a fenced block tagged as Python; untagged and ``output`` fences are not programs
_PROGRAM_RE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)


def program_of(output: str) -> str | None:
    """The Python an answer wrote: its fenced ``python`` blocks joined in order (an unclosed last block, cut off
    at the cap, runs to the end), or None for a prose answer."""
    blocks = _PROGRAM_RE.findall(output)
    return "\n".join(blocks) if blocks else None


def same_number(a: str | None, b: str | None) -> bool:
    """Whether two normalized numbers are equal to within one part in a million (a float print of an integer
    answer, 3.4000000000000004 for 3.4, still counts)."""
    if a is None or b is None:
        return False
    x, y = Decimal(a), Decimal(b)
    return abs(x - y) <= Decimal("1e-6") * max(Decimal(1), abs(y))


@functools.lru_cache(maxsize=16384)
def printed_number(program: str, timeout: float = 10.0) -> str | None:
    """The last number ``program`` prints when run sandboxed (`evals.code_exec`), or None when it fails or prints
    none. Cached, as a report regrades the same answers more than once."""
    from .code_exec import run_program

    result = run_program(program, timeout=timeout, capture=True)
    return extract_flexible(result.stdout) if result.passed else None


def grade_program_run(output: str, gold: str, prose_grade: bool) -> bool:
    """A program answer is right when its program, run, prints ``gold`` last (whatever output the text claims
    for it); a prose answer keeps ``prose_grade``."""
    program = program_of(output)
    if program is None:
        return prose_grade
    return same_number(printed_number(program), normalize_number(gold))


MATH_GRADERS = ("boxed", "math_verify")


def last_boxed(output: str) -> str | None:
    """The content of the last \\boxed{...} in ``output`` (nested braces allowed), or None."""
    start = output.rfind("\\boxed")
    if start < 0:
        return None
    i = output.find("{", start)
    if i < 0:
        return None
    depth, j = 0, i
    while j < len(output):
        depth += {"{": 1, "}": -1}.get(output[j], 0)
        if depth == 0:
            return output[i + 1 : j]
        j += 1
    return None


def normalize_latex(text: str) -> str:
    """A LaTeX answer with spacing, ``\\left``/``\\right``, ``\\dfrac``/``\\tfrac`` and a trailing period
    evened out, for a plain string comparison."""
    text = re.sub(r"\\(left|right|,|;|!|\s)", "", text)
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("$", "")
    return re.sub(r"\s+", "", text).rstrip(".")


def grade_math(output: str, gold: str) -> dict[str, bool]:
    """A MATH-500 ``output`` against its gold LaTeX answer: the last \\boxed{} as a normalised string, and
    Math-Verify (the gold wrapped in ``$...$`` as the reference evaluations do)."""
    boxed = last_boxed(output)
    return {"boxed": boxed is not None and normalize_latex(boxed) == normalize_latex(gold),
            "math_verify": grade_math_verify(output, f"${gold}$")}


CODE_GRADERS = ("pass@1",)
_FENCE_RE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)


def extract_code(output: str, entry_point: str) -> str:
    """The code of an answer: the first fenced block that defines ``entry_point``, else the first fenced
    block, else the whole text (a bare completion of the function body)."""
    blocks = _FENCE_RE.findall(output)
    defining = [b for b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.MULTILINE)]
    return (defining or blocks or [output])[0]


def code_program(prompt: str, code: str, tests: str, entry_point: str) -> str:
    """The program that tests an answer: the prompt (its imports and helpers), then the answer's code as a
    new definition of the function (or, when it does not define it, as the body the prompt ends with), then
    the tests and ``check(entry_point)``."""
    defines = re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE)
    body = f"{prompt}\n    pass\n\n{code}" if defines else prompt + code
    return f"{body}\n\n{tests}\n\ncheck({entry_point})\n"


def grade_code(output: str, prompt: str, tests: str, entry_point: str, timeout: float = 10.0) -> dict[str, bool]:
    """A HumanEval answer: does its code pass the problem's tests (see `evals.code_exec`)?"""
    from .code_exec import run_program

    program = code_program(prompt, extract_code(output, entry_point), tests, entry_point)
    return {"pass@1": run_program(program, timeout).passed}
