"""Rules, drafters and methods from outside semverify: plugins.

A plugin is a module that registers what it brings when it is imported (`register_rule`,
`register_drafter`, `register_method`), or a callable that registers them when called. semverify finds
plugins in three places, as pytest finds its plugins and vLLM its general plugins:

- the entry-point group ``semverify.plugins`` of any installed package: each entry point names a module
  (``myrules = "myrules"``) or a callable in one (``myrules = "myrules.setup:register"``);
- ``--plugin MODULE_OR_FILE`` on the commands that build methods: a dotted module name importable from here,
  or the path of a ``.py`` file (imported under a name derived from its location, the same on every run);
- the environment variable ``SEMVERIFY_PLUGINS``: such names and paths, separated by ``os.pathsep``.

`load_plugins` loads them, each once per process (a file or module whose source changed since is loaded
again, as a new process would): the command line and the evaluation harness call it before they build
methods, and library code calls it before naming a plugin's rule. Each loaded plugin is a `Plugin`, with
the sha256 of its source file, which a harness run records in its ``run.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import asdict, dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Iterable

GROUP = "semverify.plugins"
ENV = "SEMVERIFY_PLUGINS"
_HOW = ("--plugin takes a module importable from here (e.g. mypkg.rules) or the path of a .py file that "
        "registers rules, drafters or methods")


class PluginError(ValueError):
    """A plugin that cannot be found or fails to load; the message names it and where it came from."""


@dataclass(frozen=True)
class Plugin:
    """One loaded plugin: its ``name`` (the entry point's name, the module name or the path as given), where it
    came from (``origin``: ``entry point``, ``--plugin``, ``SEMVERIFY_PLUGINS`` or ``load_plugins``), the
    ``module`` it ran as, its source ``file`` and that file's ``sha256`` (None for a module without a source
    file) and, for an entry point, the ``package`` that declares it."""

    name: str
    origin: str
    module: str
    file: str | None
    sha256: str | None
    package: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


_LOADED: dict[str, Plugin] = {}  # by what was loaded: "module" or "module:attribute"
_STATE = {"entry_points": False}  # the entry points are looked up once per process


def loaded_plugins() -> list[Plugin]:
    """The plugins loaded in this process so far, in the order they were loaded."""
    return list(_LOADED.values())


def load_plugins(specs: str | Iterable[str] | None = (), origin: str = "load_plugins") -> list[Plugin]:
    """Load the installed packages' ``semverify.plugins`` entry points (the first time), then the plugins
    named in ``SEMVERIFY_PLUGINS``, then ``specs`` (module names or ``.py`` paths; ``origin`` says where they
    came from); returns every plugin loaded so far. A plugin already loaded is not loaded again unless its
    source changed. A plugin that cannot be found or raises while loading is a `PluginError` naming it."""
    if not _STATE["entry_points"]:
        for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
            _load_entry_point(ep)
        _STATE["entry_points"] = True
    for spec in os.environ.get(ENV, "").split(os.pathsep):
        if spec.strip():
            load_plugin(spec.strip(), ENV)
    for spec in [specs] if isinstance(specs, str) else specs or ():
        load_plugin(spec, origin)
    return loaded_plugins()


def load_plugin(spec: str, origin: str = "load_plugins") -> Plugin:
    """Load one plugin: a dotted module name (``mypkg.rules``, or ``mypkg.rules:register`` for a callable) or
    the path of a ``.py`` file."""
    if spec.endswith(".py") or "/" in spec or os.sep in spec:
        return _load_file(spec, origin)
    if not re.fullmatch(r"[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?", spec):
        raise PluginError(f"plugin {spec!r} ({origin}) is neither a module name nor a .py file; {_HOW}")
    return _load_module(spec, spec, origin)


def add_plugin_option(p: argparse.ArgumentParser) -> None:
    """``--plugin MODULE_OR_FILE`` (repeatable), for a command that builds rules or methods."""
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="import a module (mypkg.rules) or a .py file that registers rules, drafters or methods "
                        f"before anything is built (repeatable; also ${ENV}, {os.pathsep}-separated, and the "
                        f"{GROUP} entry points of installed packages); a run records each with its sha256")


def _sha256(path: str | None) -> str | None:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path and Path(path).is_file() else None


def _unchanged(key: str) -> bool:
    plugin = _LOADED.get(key)
    return plugin is not None and (plugin.file is None or _sha256(plugin.file) == plugin.sha256)


def _load_entry_point(ep: EntryPoint) -> Plugin:
    dist = getattr(ep, "dist", None)
    package = f"{dist.name} {dist.version}" if dist is not None else None
    where = f"entry point `{ep.name} = {ep.value}` of package {package or '(unknown)'}"
    return _load_module(ep.value, ep.name, "entry point", package, where)


def _load_module(value: str, name: str, origin: str, package: str | None = None, where: str | None = None
                 ) -> Plugin:
    key = value.replace(" ", "")
    if _unchanged(key):
        return _LOADED[key]
    module_name, _, attribute = key.partition(":")
    label = f"plugin {name!r} ({where or origin})"
    try:
        if key in _LOADED and module_name in sys.modules:  # its source changed: load it as a new process would
            module = importlib.reload(sys.modules[module_name])
        else:
            module = importlib.import_module(module_name)
        target = module
        for part in filter(None, attribute.split(".")):
            target = getattr(target, part)
        if attribute and callable(target):
            target()
    except Exception as err:
        if isinstance(err, ModuleNotFoundError) and err.name and f"{module_name}.".startswith(f"{err.name}."):
            hint = "fix or uninstall the package" if origin == "entry point" else _HOW
            raise PluginError(f"{label}: no module named {err.name!r} on the Python path; {hint}") from err
        raise PluginError(f"{label} failed to load: {type(err).__name__}: {err}") from err
    file = getattr(module, "__file__", None)
    file = str(Path(file).resolve()) if file and file.endswith(".py") else None
    _LOADED[key] = Plugin(name, origin, module_name, file, _sha256(file), package)
    return _LOADED[key]


def _load_file(spec: str, origin: str) -> Plugin:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise PluginError(f"plugin file not found: {spec} ({origin}); {_HOW}")
    if path.suffix != ".py":
        raise PluginError(f"plugin {spec} ({origin}) is not a .py file; {_HOW}")
    resolved = path.resolve()
    # a stable module name: the same file is the same module on every run (and in tracebacks and reprs)
    stem = re.sub(r"\W", "_", resolved.stem)
    module_name = f"semverify_plugin_{stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    if _unchanged(module_name):
        return _LOADED[module_name]
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if module_spec is None:
        raise PluginError(f"plugin {spec} ({origin}) cannot be imported as a Python file; {_HOW}")
    source = resolved.read_bytes()  # hashed and run: the recorded sha256 is of the code that ran
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        exec(compile(source, str(resolved), "exec"), module.__dict__)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise PluginError(f"plugin {spec} ({origin}) failed to load: {type(err).__name__}: {err}") from err
    _LOADED[module_name] = Plugin(spec, origin, module_name, str(resolved), hashlib.sha256(source).hexdigest())
    return _LOADED[module_name]
