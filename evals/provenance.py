"""What a run's rows depend on, kept in its ``run.json``: the settings, the methods' definitions, the content
hashes of the files the rows were computed from (data, datastores, probes, calibrations, the plugins that
registered rules or methods) and the environment of every start and resume. A resume with other settings,
another definition of a method or a changed file is refused, on every shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from semverify.methods import Method
from semverify.plugins import Plugin
from semverify.registry import RunContext
from semverify.rules import BaseRule

from .env import code_version, environment


@dataclass(frozen=True)
class RunSettings:
    """Everything that decides a row's content; a resumed run must match it exactly."""

    target: str
    draft: str
    dtype: str = "bfloat16"
    benchmark: str = "gsm8k"
    data: str = "auto"
    template: str = "chat"
    limit: int | None = 50
    max_new_tokens: int = 256
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    datastore: str | None = None  # retrieval drafters' datastore file (semverify datastore)
    offset: int | None = None  # problems from this position on (None: from the first; runs before it resume)
    batch_size: int | None = None  # problems decoded together per method (None: one at a time)
    coupled: bool | None = None  # sampled runs: coupled Gumbel noise per (problem, position) (None: torch streams)
    coupled_context: int | None = None  # coupled noise keyed by the last n tokens instead of position (None: position)
    coupled_noise: str | None = None  # how coupled keys become noise: "counter" (new runs), None: "legacy" (older runs)
    coupling: int | None = None  # coupled runs: how the emitted tokens are drawn (COUPLING_VERSION; None: version 1)
    samples: int | None = None  # sampled runs: outputs per problem and method (None: one)

    def context(self, tokenizer=None) -> RunContext:
        return RunContext.for_decoding(self.draft, self.target, self.do_sample, self.temperature, tokenizer)


COUPLINGS = {1: "each rule's own coupled branch, before 2026-12-07",
             2: "the engine draws each rule's emitted law under the target's noise"}
_HASHES: dict[tuple, str] = {}


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's content (remembered per path, size and mtime within a process)."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def pins(data: Path | None, methods: list[Method], rules: dict[str, BaseRule], datastore: str | None,
         plugins: list[Plugin] | None = None) -> dict:
    """Content hashes of what the rows depend on: the ``data`` file, per method its datastore (its own
    or the run's ``datastore``) and the files its rule was built from (probes, calibrations), and the
    ``plugins`` loaded (`semverify.plugins`: name, module, source file and its sha256), if any."""
    per_method = {}
    for m in methods:
        files = [*rules[m.name].artifacts, m.datastore(datastore)]
        per_method[m.name] = {str(f): file_sha256(f) for f in files if f is not None}
    pinned = {"data": {str(data): file_sha256(data)} if data is not None else {}, "methods": per_method}
    return {**pinned, "plugins": [p.to_dict() for p in plugins]} if plugins else pinned


def recorded(out: Path, name: str) -> dict | None:
    """A choice the run in ``out`` recorded when it started (``"dtypes"``, ``"accuracy"``); None when there is
    no run there yet, or it did not record that choice."""
    path = out / "run.json"
    return json.loads(path.read_text()).get(name) if path.exists() else None


def prepare_run(out: Path, settings: RunSettings, methods: list[Method], pinned: dict, pending: set[str],
                rank: int = 0, repin: bool = False, records: dict | None = None) -> None:
    """Check this run against the folder's ``run.json``; rank 0 writes it (new folder) or records the
    resume. Refused: other settings, another definition of a method the run has, and a file whose
    content changed, for the data or for a method in ``pending`` (with problems left to run); with
    ``repin`` a method's changed file (a datastore rebuilt on another machine) is accepted and recorded.
    Methods the run does not have yet are added (same problems and seeds, so they pair with the rows), and
    so are further samples (``samples`` may grow: the rows of the first samples stay what they were).
    ``records`` are choices made when the run started (the dtype of each role's model, the accuracy mode's
    batch size): written into a new run.json, and into an old one that lacks them."""
    path = out / "run.json"
    if rank != 0:  # shards check against what rank 0 wrote
        for _ in range(600):
            if path.exists():
                break
            time.sleep(0.1)
        else:
            raise ValueError(f"{path} did not appear: the rank-0 process of this run has not started it")
    spec = {"settings": asdict(settings), "methods": [m.to_dict() for m in methods]}
    if not path.exists():
        _write_json(path, {**spec, "pins": pinned, "environment": environment(**asdict(settings)), **(records or {})})
        return
    old = json.loads(path.read_text())
    check_coupling(out, old["settings"], spec["settings"])
    # settings added to semverify after a run started are unset (None) in its resume
    current = {k: v for k, v in spec["settings"].items() if not (v is None and k not in old["settings"])}
    grown = (current.get("samples") or 1) > (old["settings"].get("samples") or 1)
    if grown:  # more samples per problem: the earlier samples' rows keep their seeds
        current["samples"], more_samples = old["settings"].get("samples"), current["samples"]
    known = {m["name"]: Method.from_record(m).to_dict() for m in old["methods"]}
    changed = [m["name"] for m in spec["methods"] if m["name"] in known and known[m["name"]] != m]
    if old["settings"] != current or changed:
        what = f"other definitions of {', '.join(changed)}" if changed else "other settings"
        raise ValueError(f"{out} holds a run with {what}; resume it with the same settings or choose a new --out")
    before = old.get("pins", {"data": {}, "methods": {}})
    checked = [("the data", before["data"], pinned["data"])] + [
        (f"method {name!r}", before["methods"].get(name, {}), pinned["methods"].get(name, {})) for name in pending]
    if pending:  # a plugin's source (a rule's code) changed: refused like a method's file
        checked += [(f"plugin {p['name']!r}", _plugin_files(before), _plugin_files(pinned, p["module"]))
                    for p in pinned.get("plugins", [])]
    moved = [{"file": file, "for": who, "then": then[file], "now": digest}
             for who, then, now in checked for file, digest in now.items() if then.get(file, digest) != digest]
    for change in moved:
        if not repin or change["for"] == "the data":
            hint = "" if change["for"] == "the data" else ", or pass --repin to go on with the new file"
            raise ValueError(f"{change['file']} ({change['for']}) changed since this run started (sha256 "
                             f"{change['then'][:12]}... then, {change['now'][:12]}... now); restore it{hint} "
                             "or start a new --out")
    if rank != 0:
        return
    if moved:
        print(f"semverify compare: --repin: going on with {len(moved)} changed file(s), recorded in {path}",
              file=sys.stderr)
        old.setdefault("repinned", []).append({"files": moved, "environment": environment(**asdict(settings))})
    if old.get("environment", {}).get("code") != (code := code_version()):
        print(f"semverify compare: resuming {out}, started with code {old.get('environment', {}).get('code')}, "
              f"with code {code}", file=sys.stderr)
    old["pins"] = {"data": {**before["data"], **pinned["data"]},
                   "methods": {**before["methods"], **pinned["methods"]}}
    plugins = {p["module"]: p for p in [*before.get("plugins", []), *pinned.get("plugins", [])]}
    if plugins:
        old["pins"]["plugins"] = list(plugins.values())
    old.update({name: value for name, value in (records or {}).items() if name not in old})
    if grown:
        old["settings"]["samples"] = more_samples
        old.setdefault("samples_grown", []).append({"samples": more_samples,
                                                     "environment": environment(**asdict(settings))})
    added = [m for m in spec["methods"] if m["name"] not in known]
    if added:
        old["methods"] += added
        old.setdefault("added", []).append({"methods": [m["name"] for m in added],
                                            "environment": environment(**asdict(settings))})
    else:
        old.setdefault("resumed", []).append(environment(**asdict(settings)))
    _write_json(path, old)


def check_coupling(out: Path, old: dict, new: dict) -> None:
    """Refuse to resume coupled rows drawn under another construction (`COUPLING_VERSION`): their tokens follow
    other laws for lossy rules, so old and new rows are never pooled or paired."""
    if not old.get("coupled") or not new.get("coupled"):
        return
    then, now = old.get("coupling") or 1, new.get("coupling") or 1
    if then != now:
        raise ValueError(f"{out} holds coupled rows drawn under coupling {then} ({COUPLINGS.get(then, '?')}); this "
                         f"code draws coupling {now} ({COUPLINGS.get(now, '?')}), and the two are never pooled: "
                         f"report the old rows as they are, and run the new construction in a new --out")


def _plugin_files(pinned: dict, module: str | None = None) -> dict:
    """{source file: sha256} of the pinned plugins (``module``: of that one only)."""
    return {p["file"]: p["sha256"] for p in pinned.get("plugins", [])
            if p.get("sha256") and module in (None, p["module"])}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
