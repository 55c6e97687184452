"""The documentation still names things that exist (README.md and docs/**/*.md).

- Every fenced ```python block parses, and the names it imports from ``semverify`` or ``evals`` (and the
  attributes it reads off those modules, ``semverify.generate``) exist. Nothing is executed and no model loads.
- Every shell command (```bash, ```sh, ```console blocks, and inline code that starts with ``semverify ``) that
  runs ``semverify CMD`` names an installed subcommand, and each ``--flag`` it passes appears in that
  subcommand's ``--help`` (read once per subcommand, in this process). ``python -m evals.X`` names a module,
  ``python FILE.py`` and ``bash FILE.sh`` name files of the repository, and ``pip install ".[a,b]"`` names
  extras that pyproject.toml declares.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import re
import shlex
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell", "console"}
CHECKED_PACKAGES = ("semverify", "evals")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence (or of the inline span), 1-based
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


# -- finding examples -------------------------------------------------------------------------------------

FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)")
INLINE_COMMAND = re.compile(r"(?<!`)`((?:\.venv/bin/)?semverify [^`]+)`(?!`)")


def fenced_blocks(page: Path) -> tuple[list[Block], str]:
    """The page's fenced blocks, and its text with them blanked (for the inline spans)."""
    blocks, prose = [], []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            prose.append(lines[i])
            i += 1
            continue
        fence, lang = opening.group(1), opening.group(2).lower()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", lines[j]):
            body.append(lines[j])
            j += 1
        indent = len(lines[i]) - len(lines[i].lstrip())
        blocks.append(Block(page, i + 1, lang, "\n".join(b[indent:] if b[:indent].isspace() else b for b in body)))
        prose.extend([""] * (j + 1 - i))
        i = j + 1
    return blocks, "\n".join(prose)


def inline_commands(page: Path, prose: str) -> list[Block]:
    return [Block(page, prose.count("\n", 0, m.start()) + 1, "inline", " ".join(m.group(1).split()))
            for m in INLINE_COMMAND.finditer(prose)]


def all_blocks() -> list[Block]:
    found = []
    for page in PAGES:
        blocks, prose = fenced_blocks(page)
        found += blocks + inline_commands(page, prose)
    return found


BLOCKS = all_blocks()
PYTHON_BLOCKS = [b for b in BLOCKS if b.lang in PYTHON]
SHELL_BLOCKS = [b for b in BLOCKS if b.lang in SHELL or b.lang == "inline"]


# -- Python examples --------------------------------------------------------------------------------------

def _resolve(module: str, attribute: str) -> bool:
    mod = importlib.import_module(module)
    if hasattr(mod, attribute):
        return True
    try:
        return importlib.util.find_spec(f"{module}.{attribute}") is not None
    except ModuleNotFoundError:
        return False


def _checked(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in CHECKED_PACKAGES


def python_problems(source: str) -> list[str]:
    """What is wrong with one Python example: a syntax error, or a missing module, name or attribute."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [f"does not parse: {err.msg} (line {err.lineno} of the block)"]
    problems, modules = [], {}  # local name -> module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _checked(alias.name):
                    continue
                try:
                    importlib.import_module(alias.name)
                except ImportError as err:
                    problems.append(f"import {alias.name}: {err}")
                    continue
                if alias.asname:
                    modules[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    modules[root] = root
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _checked(node.module):
            try:
                importlib.import_module(node.module)
            except ImportError as err:
                problems.append(f"from {node.module} import ...: {err}")
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                if not _resolve(node.module, alias.name):
                    problems.append(f"from {node.module} import {alias.name}: {node.module} has no {alias.name!r}")
                    continue
                value = getattr(importlib.import_module(node.module), alias.name, None)
                if value is None or inspect.ismodule(value):  # a submodule: its attributes are checked too
                    modules[alias.asname or alias.name] = getattr(value, "__name__", f"{node.module}.{alias.name}")
    modules.setdefault("semverify", "semverify")  # examples continue each other: `semverify` is the package
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _dotted(node)
            if chain and chain[0] in modules:
                problem = _attribute_problem(modules[chain[0]], chain[1:])
                if problem:
                    problems.append(problem)
    return sorted(set(problems))


def _dotted(node: ast.Attribute) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _attribute_problem(module: str, attributes: list[str]) -> str | None:
    obj, path = importlib.import_module(module), module
    for attr in attributes:
        if not (inspect.ismodule(obj) or inspect.isclass(obj)):
            return None  # an instance's attributes are not checked
        if not hasattr(obj, attr):
            if inspect.ismodule(obj) and _resolve(path, attr):
                obj, path = importlib.import_module(f"{path}.{attr}"), f"{path}.{attr}"
                continue
            return f"{path}.{attr} does not exist"
        obj, path = getattr(obj, attr), f"{path}.{attr}"
    return None


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.where for b in PYTHON_BLOCKS])
def test_python_example_parses_and_its_names_exist(block: Block) -> None:
    assert python_problems(block.text) == [], block.where


# -- shell commands ---------------------------------------------------------------------------------------

def logical_lines(block: Block) -> list[str]:
    """Command lines with their backslash continuations joined; console blocks keep only `$ ` lines."""
    lines, current, continuing = [], "", False
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if block.lang == "console" and not continuing:
            if not line.lstrip().startswith("$ "):
                continue
            line = line.lstrip()[2:]
        current += (" " if current else "") + line.rstrip("\\").strip()
        continuing = line.endswith("\\")
        if not continuing:
            if current:
                lines.append(current)
            current = ""
    if current:
        lines.append(current)
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line (split at &&, ||, ;, |), environment assignments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, current = [], []
    for token in lexer:
        if token in SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    for command in commands:
        while command and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", command[0]):
            command.pop(0)
    return [c for c in commands if c]


@lru_cache(maxsize=None)
def _semverify_main():
    (script,) = entry_points(group="console_scripts", name="semverify")
    return script.load()


@lru_cache(maxsize=None)
def help_text(*argv: str) -> str:
    """`semverify ARGV --help`, run in this process (read once per subcommand)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            _semverify_main()([*argv, "--help"])
        except SystemExit:
            pass
    return out.getvalue()


@lru_cache(maxsize=None)
def subcommands() -> frozenset[str]:
    usage = help_text()
    groups = re.findall(r"\{([\w,-]+)\}", usage)
    assert groups, f"no subcommands found in `semverify --help`:\n{usage}"
    return frozenset(name for group in groups for name in group.split(","))


def _flag_in_help(flag: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


def semverify_problems(args: list[str]) -> list[str]:
    if not args:
        return []
    if args[0].startswith("-"):  # `semverify --help`
        flag = args[0].split("=", 1)[0]
        return [] if _flag_in_help(flag, help_text()) else [f"semverify {flag}: not an option of `semverify`"]
    command, rest = args[0], args[1:]
    if re.fullmatch(r"[A-Z][A-Z_]*", command):  # a placeholder (`semverify CMD --help`)
        return []
    if command not in subcommands():
        return [f"semverify {command}: no such subcommand (installed: {', '.join(sorted(subcommands()))})"]
    text = help_text(command)
    problems = []
    for token in rest:
        if not token.startswith("-") or token in ("-", "--") or re.match(r"^-\d", token):
            continue
        flag = token.split("=", 1)[0]
        if not _flag_in_help(flag, text):
            problems.append(f"semverify {command}: no option {flag} in `semverify {command} --help`")
    return problems


@lru_cache(maxsize=None)
def extras() -> frozenset[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return frozenset(project.get("optional-dependencies", {}))


def command_problems(command: list[str]) -> list[str]:
    """What is wrong with one simple command, as far as the repository can tell."""
    program = Path(command[0]).name
    if program == "semverify":
        return semverify_problems(command[1:])
    if program in ("pip", "pip3") or command[1:3] == ["-m", "pip"]:
        problems = []
        for token in command:
            match = re.fullmatch(r"(?:\.|semverify)\[([\w,-]+)\]", token)
            for extra in match.group(1).split(",") if match else []:
                if extra not in extras():
                    problems.append(f"pip install {token}: pyproject.toml declares no extra {extra!r}")
        return problems
    if "-m" in command[:-1]:  # python -m X, accelerate launch ... -m X, torchrun ... -m X
        i = command.index("-m")
        module, rest = command[i + 1], command[i + 2 :]
        if module == "semverify.cli":
            return semverify_problems(rest)
        if _checked(module):
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            return [] if found else [f"python -m {module}: no such module"]
        return []
    if re.fullmatch(r"python[\d.]*", program) or program in ("bash", "sh"):
        scripts = [t for t in command[1:2] if t.endswith((".py", ".sh"))]
        return [f"{program} {s}: no such file in the repository" for s in scripts if not (ROOT / s).is_file()]
    return []


def shell_problems(block: Block) -> list[str]:
    problems = []
    for line in logical_lines(block):
        try:
            commands = simple_commands(line)
        except ValueError as err:
            problems.append(f"cannot split {line!r}: {err}")
            continue
        for command in commands:
            problems += command_problems(command)
    return problems


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=[f"{b.where}:{b.lang}" for b in SHELL_BLOCKS])
def test_shell_command_names_a_real_subcommand_and_real_flags(block: Block) -> None:
    assert shell_problems(block) == [], block.where


# -- the checks themselves --------------------------------------------------------------------------------

def test_the_docs_hold_examples_of_every_kind() -> None:
    assert (ROOT / "docs" / "index.md").is_file() and len(PAGES) > 5
    assert len(PYTHON_BLOCKS) >= 5
    commands = [c for b in SHELL_BLOCKS for line in logical_lines(b) for c in simple_commands(line)]
    named = {c[1] for c in commands if Path(c[0]).name == "semverify" and len(c) > 1}
    assert {"generate", "compare", "report", "sweep"} <= named


def test_the_checks_catch_what_they_are_for() -> None:
    """Negative controls: a bogus flag, a bogus subcommand, a missing name, a missing module, broken syntax."""
    bash = Block(ROOT / "README.md", 1, "bash",
                 "bash scripts/setup.sh && .venv/bin/semverify compare --methods sd --no-such-flag 3 \\\n"
                 "  --limit 2\nsemverify no-such-command --limit 2\npython -m evals.no_such_module\n"
                 "pip install -e '.[models,no-such-extra]'")
    problems = shell_problems(bash)
    assert any("no option --no-such-flag" in p for p in problems), problems
    assert not any("--limit" in p or "--methods" in p for p in problems), problems
    assert any("no-such-command: no such subcommand" in p for p in problems), problems
    assert any("evals.no_such_module" in p for p in problems), problems
    assert any("no-such-extra" in p for p in problems), problems
    console = Block(ROOT / "README.md", 1, "console", "$ semverify generate hi --bogus\nsemverify: --not-a-command")
    assert shell_problems(console) == ["semverify generate: no option --bogus in `semverify generate --help`"]
    accepted = ["generate", "hi", "--draft=x", "-k", "5", "--rule-param", "posterior_threshold=0.09"]
    assert semverify_problems(accepted) == []
    assert python_problems("from semverify import generate, NoSuchThing\n") == [
        "from semverify import NoSuchThing: semverify has no 'NoSuchThing'"]
    assert python_problems("import semverify\nsemverify.no_such_function(1)\n") == [
        "semverify.no_such_function does not exist"]
    assert python_problems("from semverify.sense import RetrievalDrafter\nimport semverify.no_such_module\n")
    assert python_problems("out = semverify.generate(\n")[0].startswith("does not parse")
    assert python_problems("import semverify\nsemverify.sense.RetrievalDrafter\nimport torch\ntorch.nope\n") == []


SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc):`")


def sphinx_roles(source: str) -> list[str]:
    """Sphinx cross-reference roles in ``source``: the API pages (mkdocstrings, Markdown) print them literally."""
    return SPHINX_ROLE.findall(source)


def test_docstrings_are_markdown_without_sphinx_roles() -> None:
    sources = [p for package in CHECKED_PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]
    found = [f"{p.relative_to(ROOT)}: {role}" for p in sources for role in sphinx_roles(p.read_text())]
    assert found == []
    assert sphinx_roles("see :class:`Method` and :func:`load_methods`") == [":class:`", ":func:`"]


def test_the_gpu_check_script_runs_real_commands_and_flags() -> None:
    """scripts/gpu-check.sh runs on lent GPUs only, so its commands are checked here, like the docs' ones."""
    script = (ROOT / "scripts" / "gpu-check.sh").read_text().replace('"${semverify[@]}"', "semverify")
    before, _, rest = script.partition("<<'EOF'")
    text = before + rest.partition("\nEOF\n")[2]  # without the embedded Python
    block = Block(ROOT / "scripts" / "gpu-check.sh", 1, "bash", text)
    commands = [c for line in logical_lines(block) for c in simple_commands(line)]
    assert {c[1] for c in commands if c[0] == "semverify"} == {"compare", "speed", "throughput", "loop-cost"}
    assert shell_problems(block) == []
