"""The engine stays readable in one sitting: no function past a screen, no engine helper with more than six
parameters, noise told apart in one module only, copies built by their class, and a glossary that names every
working word it lists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import semverify
import semverify.engine

ROOT = Path(semverify.__file__).parent
ENGINE = ROOT / "engine"
MOST_LINES, MOST_PARAMS = 60, 6
PUBLIC_ENTRY = {"speculative_generate"}  # mirrors generate()'s keywords, as transformers' generate does
NOISE_TYPES = {"CoupledNoise", "CoupledRows", "Generator"}


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def params(node: ast.FunctionDef) -> list[str]:
    a = node.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ("self", "cls")]


def test_no_function_is_longer_than_a_screen():
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in ROOT.rglob("*.py") for node in functions(path)
            if node.end_lineno - node.lineno + 1 > MOST_LINES]
    assert not long, long


def test_engine_helpers_take_at_most_six_parameters():
    wide = [f"{path.name}:{node.lineno} {node.name} ({len(params(node))})" for path in ENGINE.glob("*.py")
            for node in functions(path)
            if len(params(node)) > MOST_PARAMS and node.name not in PUBLIC_ENTRY and node.name != "__init__"]
    assert not wide, wide


def test_noise_kinds_are_told_apart_in_the_noise_module_only():
    found = []
    for path in ROOT.rglob("*.py"):
        if path == ENGINE / "noise.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                names = {getattr(n, "id", getattr(n, "attr", None)) for n in ast.walk(node.args[1])}
                subject = ast.unparse(node.args[0])
                if names & NOISE_TYPES or ("generator" in subject or "noise" in subject):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not found, found


def test_copies_are_built_by_their_class():
    found = [f"{path.relative_to(ROOT)}:{i}" for path in [*ENGINE.glob("*.py"), *(ROOT / "drafters").glob("*.py")]
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if "__new__(" in line or re.search(r"\bsetattr\(", line)]
    assert not found, found


def test_the_glossary_words_are_the_engines():
    """Every word the glossary defines is used in the engine's code, and the docs' walk through a step uses the
    glossary's words (a renamed word must be renamed in both)."""
    glossary = semverify.engine.__doc__.split("Glossary:", 1)[1]
    words = re.findall(r"\*\*([a-z ]+)\*\*", glossary)
    assert len(words) >= 20
    code = "\n".join(p.read_text() for p in ENGINE.glob("*.py") if p.name != "__init__.py").lower().replace("_", " ")
    unused = [w for w in words if w not in code]
    assert not unused, unused
    walk = (ROOT.parent / "docs" / "contributing.md").read_text().split("## One step of the loop", 1)[1]
    walk = walk.split("\n## ", 1)[0].lower()
    missing = [w for w in ("draft", "budget", "ready", "waiting", "unseen", "path", "verdict", "accepted",
                           "next token", "settle", "going", "noise", "hole") if w not in walk]
    assert not missing, missing


def test_the_former_rule_name_warns_and_is_the_base_rule():
    with pytest.warns(DeprecationWarning, match="BaseRule"):
        old = semverify.AcceptanceRule
    assert old is semverify.BaseRule
