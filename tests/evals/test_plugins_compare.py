"""A researcher's rule from outside semverify, through `semverify compare` and `semverify report` on the tiny
random checkpoint: loaded by an installed package's entry point, ``--plugin FILE``, ``--plugin MODULE`` or
``SEMVERIFY_PLUGINS``, pinned in ``run.json`` by its sha256, and a resume after it changed refused unless
``--repin``."""

from __future__ import annotations

import json

import pytest

from evals.rows import read_rows
from semverify import plugins
from semverify.cli import main
from semverify.plugins import ENV
from tests.evals.test_cli_errors import one_line_error
from tests.helpers import REPO
from tests.semverify.test_plugins import isolated, plugin_source, sha256, write_file, write_package  # noqa: F401

pytestmark = pytest.mark.usefixtures("isolated")  # registries and loaded plugins as a fresh process has them


def compare(checkpoint, out, methods="vanilla,capped", limit=1, extra=()):
    return ["compare", "--target", str(checkpoint), "--draft", str(checkpoint), "--methods", methods, "--data",
            "sample", "--limit", str(limit), "--max-new-tokens", "10", "--dtype", "float32", "--out", str(out),
            *extra]


def forget_plugins():
    """As a new process without the plugin: its rule and method unknown, nothing loaded (the ``isolated``
    fixture restores the real registries after the test)."""
    from semverify import methods, plugins, registry

    plugins._LOADED.clear()
    for table, name in ((registry._RULES, "capped_greedy"), (methods._METHODS, "capped")):
        table.entries.pop(name, None)


def test_an_installed_plugins_method_runs_in_compare_and_report(tiny_checkpoint, tmp_path, monkeypatch):
    source = write_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    run = tmp_path / "run"
    assert main(compare(tiny_checkpoint, run, limit=2)) == 0
    rows = [r for r in read_rows(run) if r["method"] == "capped"]
    assert len(rows) == 2 and all(r["reasons"].get("capped") for r in rows)  # the plugin's rule judged the drafts
    assert max(max(r["accept_lengths"]) for r in rows) <= 2  # its cap of 2 kept tokens per step
    text = (run / "report.md").read_text()
    assert "| capped | yes |" in text and "`capped` = `vanilla` on 2 of 2" in text  # lossless, as it declares
    assert json.loads((run / "run.json").read_text())["pins"]["plugins"] == [
        {"name": "myrules", "origin": "entry point", "module": "myrules", "file": str(source.resolve()),
         "sha256": sha256(source), "package": "myrules 0.1"}]


def test_a_changed_plugin_file_is_refused_on_resume_unless_repinned(tiny_checkpoint, tmp_path, capsys):
    path = write_file(tmp_path / "rules" / "capped_rule.py")
    run = tmp_path / "run"
    with_plugin = ["--plugin", str(path), "--no-report"]
    line = one_line_error(compare(tiny_checkpoint, run, extra=with_plugin[2:]), capsys)
    assert line.startswith("semverify compare: unknown method 'capped'")  # without the plugin
    assert main(compare(tiny_checkpoint, run, extra=with_plugin)) == 0
    (pinned,) = json.loads((run / "run.json").read_text())["pins"]["plugins"]
    assert pinned == {"name": str(path), "origin": "--plugin", "module": pinned["module"], "file": str(path.resolve()),
                      "sha256": sha256(path)}
    then = pinned["sha256"]

    write_file(path, plugin_source(cap=3))  # the researcher edits the rule, then resumes the run with one more method
    resume = compare(tiny_checkpoint, run, "vanilla,capped,capped:cap=1", extra=with_plugin)
    line = one_line_error(resume, capsys)
    assert line == (f"semverify compare: {path.resolve()} (plugin '{path}') changed since this run started (sha256 "
                    f"{then[:12]}... then, {sha256(path)[:12]}... now); restore it, or pass --repin to go on with "
                    "the new file or start a new --out")
    assert {r["method"] for r in read_rows(run)} == {"vanilla", "capped"}  # refused before anything ran
    assert main([*resume, "--repin"]) == 0
    record = json.loads((run / "run.json").read_text())
    assert record["repinned"][0]["files"] == [{"file": str(path.resolve()), "for": f"plugin '{path}'", "then": then,
                                               "now": sha256(path)}]
    assert [p["sha256"] for p in record["pins"]["plugins"]] == [sha256(path)]
    assert {r["method"] for r in read_rows(run)} == {"vanilla", "capped", "capped:cap=1"}

    assert main(["report", str(run), "--plugin", str(path)]) == 0
    assert "| capped | yes |" in capsys.readouterr().out
    forget_plugins()  # a new shell, without --plugin: the report says what is missing, the resume too
    assert main(["report", str(run)]) == 0
    out, err = capsys.readouterr()
    assert "| capped | ? |" in out  # whether the rule is lossless is unknown without it
    assert f"the run in {run} was started with plugins that are not loaded now: pass --plugin {path.resolve()}" in err
    line = one_line_error(compare(tiny_checkpoint, run, "vanilla,capped,capped:cap=1", extra=["--no-report"]), capsys)
    assert line.startswith("semverify compare: unknown method 'capped'") and line.endswith(
        f"; the run in {run} was started with plugins that are not loaded now: pass --plugin {path.resolve()}")


@pytest.mark.parametrize("how", ["module", "environment"])
def test_a_plugin_module_or_the_environment_variable_reaches_compare(tiny_checkpoint, tmp_path, monkeypatch, how):
    run = tmp_path / "run"
    if how == "module":
        write_package(tmp_path / "site", entry_point=None)
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        extra = ["--plugin", "myrules"]
    else:
        monkeypatch.setenv(ENV, str(write_file(tmp_path / "capped_rule.py")))
        extra = []
    assert main(compare(tiny_checkpoint, run, "capped", extra=[*extra, "--no-report"])) == 0
    assert [r["method"] for r in read_rows(run)] == ["capped"]
    (pinned,) = json.loads((run / "run.json").read_text())["pins"]["plugins"]
    assert pinned["origin"] == ("--plugin" if how == "module" else ENV) and len(pinned["sha256"]) == 64


def test_the_example_plugin_runs_as_its_docstring_says(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    run = tmp_path / "run"
    assert main(compare(tiny_checkpoint, run, "vanilla,topk_match",
                        extra=["--plugin", "examples/custom_rule.py", "--no-report"])) == 0
    rows = [r for r in read_rows(run) if r["method"] == "topk_match"]
    assert len(rows) == 1 and "topk" in rows[0]["reasons"]  # the rule judged the drafts (its reason is counted)
    (pinned,) = json.loads((run / "run.json").read_text())["pins"]["plugins"]
    assert pinned["name"] == "examples/custom_rule.py" and pinned["sha256"] == sha256(REPO / "examples/custom_rule.py")


def test_a_plugin_that_cannot_load_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    base = ["compare", "--target", "/no/such/model", "--methods", "vanilla", "--out", str(tmp_path / "run")]
    assert one_line_error([*base, "--plugin", "no_such_rules_module"], capsys) == (
        "semverify compare: plugin 'no_such_rules_module' (--plugin): no module named 'no_such_rules_module' on the "
        "Python path; --plugin takes a module importable from here (e.g. mypkg.rules) or the path of a .py file "
        "that registers rules, drafters or methods")
    assert one_line_error([*base, "--plugin", str(tmp_path / "nope.py")], capsys).startswith(
        f"semverify compare: plugin file not found: {tmp_path / 'nope.py'} (--plugin)")
    broken = write_file(tmp_path / "broken.py", "import torch\ntorch.no_such_function()\n")
    assert one_line_error([*base, "--plugin", str(broken)], capsys) == (
        f"semverify compare: plugin {broken} (--plugin) failed to load: AttributeError: module 'torch' has no "
        "attribute 'no_such_function'")
    monkeypatch.setenv(ENV, str(broken))
    assert "(SEMVERIFY_PLUGINS) failed to load" in one_line_error(["report", str(tmp_path)], capsys)
    monkeypatch.delenv(ENV)
    write_package(tmp_path / "site", source="raise RuntimeError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(plugins._STATE, "entry_points", False)  # a new process, with the package installed
    assert one_line_error(base, capsys) == (
        "semverify compare: plugin 'myrules' (entry point `myrules = myrules` of package myrules 0.1) failed to load: "
        "RuntimeError: needs a GPU")
