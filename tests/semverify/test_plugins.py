"""Plugins: rules, drafters and methods registered from outside semverify, through the ``semverify.plugins``
entry points of an installed package, ``--plugin MODULE_OR_FILE`` and ``SEMVERIFY_PLUGINS``.

The plugin here lives in pytest's tmp_path, outside the repository; a package is "installed" by putting a
``dist-info`` folder beside it on ``sys.path``, which is all ``importlib.metadata.entry_points`` reads.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import sys
from pathlib import Path

import pytest

from semverify import available_methods, available_rules, load_plugins
from semverify.cli import main
from semverify.plugins import ENV, PluginError, loaded_plugins
from tests.helpers import REPO

# a lossless rule (greedy matching, at most ``cap`` tokens kept per step) and a method that uses it
PLUGIN = '''
"""A researcher's rule, outside semverify."""

from semverify import BaseRule, Method, Verdict, register_method, register_rule
from semverify.rules import at_position, leading_true, prefix_mask, target_choices


class CappedGreedy(BaseRule):
    name = "capped_greedy"
    lossless = True  # the target's own choice at every position: greedy matching keeps its output

    def __init__(self, cap: int = CAP) -> None:
        self.cap = cap

    def __call__(self, x):
        choice = target_choices(x)
        n = leading_true(choice[:, : x.k] == x.draft.tokens).clamp(max=self.cap)
        return Verdict(n, at_position(choice, n), {"capped": prefix_mask(n, x.k)}, target_tokens=choice[:, : x.k])


def register():
    register_rule("capped_greedy", CappedGreedy)
    register_method(Method("capped", "model", "capped_greedy", k=4))


REGISTER_ON_IMPORT
'''


def plugin_source(cap: int = 2, on_import: bool = True) -> str:
    return PLUGIN.replace("CAP", str(cap)).replace("REGISTER_ON_IMPORT", "register()" if on_import else "")


def write_package(root: Path, entry_point: str | None = "myrules", source: str | None = None) -> Path:
    """``root/myrules/__init__.py`` (the plugin) and, with ``entry_point``, an installed-package record
    ``myrules-0.1.dist-info`` declaring ``[semverify.plugins] myrules = <entry_point>``; returns the module file."""
    package = root / "myrules"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(source if source is not None else plugin_source())
    if entry_point is not None:
        info = root / "myrules-0.1.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myrules\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[semverify.plugins]\nmyrules = {entry_point}\n")
    return package / "__init__.py"


def write_file(path: Path, source: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source if source is not None else plugin_source())
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def isolated(monkeypatch):
    """Registries, loaded plugins and plugin modules as they were before the test (what a fresh process sees)."""
    from semverify import methods, plugins, registry

    for table in (registry._RULES, registry._DRAFTERS, methods._METHODS):
        monkeypatch.setattr(table, "entries", dict(table.entries))
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setitem(plugins._STATE, "entry_points", False)
    monkeypatch.delenv(ENV, raising=False)
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ("myrules", "broken") or
                 m.startswith("semverify_plugin_")]:
        del sys.modules[name]


def test_an_installed_packages_entry_point_registers_its_rule_and_method(isolated, tmp_path, monkeypatch):
    source = write_package(tmp_path)
    assert "capped" not in available_methods() and "capped_greedy" not in available_rules()
    monkeypatch.syspath_prepend(str(tmp_path))
    (plugin,) = load_plugins()
    assert "capped" in available_methods() and "capped_greedy" in available_rules()
    assert plugin.to_dict() == {"name": "myrules", "origin": "entry point", "module": "myrules",
                                "file": str(source.resolve()), "sha256": sha256(source), "package": "myrules 0.1"}
    module = sys.modules["myrules"]
    assert load_plugins() == [plugin] and sys.modules["myrules"] is module  # once per process


def test_an_entry_point_may_name_a_callable_which_is_called_once(isolated, tmp_path, monkeypatch):
    write_package(tmp_path, "myrules:register", plugin_source(on_import=False))
    monkeypatch.syspath_prepend(str(tmp_path))
    import myrules  # importing alone registers nothing: the entry point's callable does

    assert "capped" not in available_methods()
    (plugin,) = load_plugins()
    assert "capped" in available_methods() and plugin.module == "myrules" and plugin.name == "myrules"
    calls = []
    monkeypatch.setattr(myrules, "register", lambda: calls.append(1))
    load_plugins()
    assert calls == []


@pytest.mark.parametrize("how", ["file", "module", "environment"])
def test_a_plugin_by_file_module_name_or_environment_variable(isolated, tmp_path, monkeypatch, how):
    if how == "module":
        source, spec = write_package(tmp_path, entry_point=None), "myrules"
        monkeypatch.syspath_prepend(str(tmp_path))
    else:
        source = write_file(tmp_path / "rules" / "capped_rule.py")
        spec = str(source)
    assert "capped" not in available_methods()
    if how == "environment":
        monkeypatch.setenv(ENV, os.pathsep.join(["", spec, " "]))
        (plugin,) = load_plugins()
    else:
        (plugin,) = load_plugins([spec], "--plugin")
    assert "capped" in available_methods() and "capped_greedy" in available_rules()
    assert plugin.name == spec and plugin.file == str(source.resolve()) and plugin.sha256 == sha256(source)
    assert plugin.origin == {"file": "--plugin", "module": "--plugin", "environment": ENV}[how]
    assert load_plugins([spec]) == [plugin]  # loaded once


def test_a_file_keeps_its_module_name_and_is_loaded_again_when_it_changes(isolated, tmp_path, monkeypatch):
    from semverify.registry import get_rule

    path = write_file(tmp_path / "capped_rule.py")
    first = load_plugins([str(path)])[0]
    assert first.module.startswith("semverify_plugin_capped_rule_") and get_rule("capped_greedy").cap == 2
    monkeypatch.chdir(tmp_path)
    assert load_plugins(["./capped_rule.py"]) == [first]  # the same file from another working directory
    write_file(path, plugin_source(cap=3))  # as a new process would: the new code, under the same module name
    (second,) = load_plugins([str(path)])
    assert second.module == first.module and second.sha256 == sha256(path) != first.sha256
    assert get_rule("capped_greedy").cap == 3 and type(get_rule("capped_greedy")).__module__ == first.module


@pytest.mark.parametrize("spec, message", [
    ("no_such_plugin_module", "plugin 'no_such_plugin_module' (--plugin): no module named 'no_such_plugin_module' "
                              "on the Python path; --plugin takes a module"),
    ("/no/such/rule.py", "plugin file not found: /no/such/rule.py (--plugin); --plugin takes a module"),
    ("not a module!", "plugin 'not a module!' (--plugin) is neither a module name nor a .py file"),
])
def test_a_plugin_that_is_not_there_is_named(isolated, spec, message):
    with pytest.raises(PluginError) as info:
        load_plugins([spec], "--plugin")
    assert str(info.value).startswith(message)
    assert isinstance(info.value, ValueError)  # the command line prints it as one line


def test_a_plugin_that_raises_is_named_with_its_error(isolated, tmp_path, monkeypatch):
    path = write_file(tmp_path / "broken.py", "raise RuntimeError('no GPU here')\n")
    with pytest.raises(PluginError, match=rf"^plugin {path} \(--plugin\) failed to load: RuntimeError: no GPU here"):
        load_plugins([str(path)], "--plugin")
    assert not [m for m in sys.modules if m.startswith("semverify_plugin_broken")] and loaded_plugins() == []
    monkeypatch.syspath_prepend(str(tmp_path))  # as a module: the same message, with the import error chained
    with pytest.raises(PluginError, match=r"^plugin 'broken' \(--plugin\) failed to load: RuntimeError") as info:
        load_plugins(["broken"], "--plugin")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_entry_point_that_fails_names_the_plugin_and_its_package(isolated, tmp_path, monkeypatch):
    write_package(tmp_path, source="import no_such_dependency_of_myrules\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as info:
        load_plugins()
    assert str(info.value) == ("plugin 'myrules' (entry point `myrules = myrules` of package myrules 0.1) failed to "
                               "load: ModuleNotFoundError: No module named 'no_such_dependency_of_myrules'")
    write_package(tmp_path, "myrules_gone")  # the entry point names a module the package does not have
    with pytest.raises(PluginError, match="of package myrules 0.1\\): no module named 'myrules_gone' on the Python "
                                          "path; fix or uninstall the package"):
        load_plugins()


def test_the_command_line_loads_plugins_for_rules_and_generate(isolated, tmp_path, capsys, tiny_checkpoint):
    path = write_file(tmp_path / "capped_rule.py")
    generate = ["generate", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--rule",
                "capped_greedy", "--max-new-tokens", "6", "--dtype", "float32", "--json", "hi"]
    with pytest.raises(SystemExit) as info:  # not loaded: an unknown rule, before any model loads
        main(generate)
    assert info.value.code == 2 and "unknown acceptance rule 'capped_greedy'" in capsys.readouterr().err
    main(["rules", "--plugin", str(path)])
    assert "capped_greedy: cap=2\n    (no description)\n" in capsys.readouterr().out
    assert main([*generate, "--plugin", str(path)]) == 0
    err = capsys.readouterr().err
    assert '"capped"' in err  # the rule's reason in the statistics: the plugin's rule judged the drafts
    with pytest.raises(SystemExit) as info:
        main(["rules", "--plugin", str(tmp_path / "missing.py")])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == (f"semverify rules: plugin file not found: {tmp_path / 'missing.py'} "
                                               "(--plugin); --plugin takes a module importable from here (e.g. "
                                               "mypkg.rules) or the path of a .py file that registers rules, "
                                               "drafters or methods")


def test_the_example_plugin_registers_the_contributing_pages_rule(isolated, capsys):
    example = REPO / "examples" / "custom_rule.py"
    assert "topk_match" not in available_methods()
    (plugin,) = load_plugins([str(example)], "--plugin")
    assert "topk_match" in available_methods() and "topk_match" in available_rules()
    assert plugin.sha256 == sha256(example)
    runpy.run_path(str(example), run_name="__main__")  # as a script: checks the rule on hand-built tensors
    assert "semverify compare --plugin" in capsys.readouterr().out
    docstring = example.read_text().split('"""')[1]
    assert "semverify compare --plugin examples/custom_rule.py --methods vanilla,sd,topk_match" in docstring
