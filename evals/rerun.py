"""Two runs of the same methods side by side (a rerun with another batch size, dtype or machine): per method,
accuracy in each on the problems both finished, the paired test between them, and how many outputs match."""

from __future__ import annotations

import json
from pathlib import Path

from .benchmarks import get_benchmark
from .report import format_accuracy
from .rows import read_rows
from .summary import accuracy, mcnemar


def against(run_dir: str | Path, other_dir: str | Path, grader: str | None = None) -> dict:
    """Each method both runs hold, on the problems both finished it: accuracy in each run, exact McNemar
    test between them, identical outputs; plus the settings that differ. Runs of different benchmarks
    are refused (their problem ids mean different problems)."""
    runs = [json.loads((Path(d) / "run.json").read_text()) for d in (run_dir, other_dir)]
    settings = [r["settings"] for r in runs]
    if settings[0]["benchmark"] != settings[1]["benchmark"]:
        raise ValueError(f"{run_dir} ran {settings[0]['benchmark']} and {other_dir} ran {settings[1]['benchmark']}: "
                         "their problems cannot be paired")
    bench = get_benchmark(settings[0]["benchmark"])
    grader = grader or bench.main_grader
    rows = [{((r["id"], r.get("sample", 0)), r["method"]): bench.regrade(r, s["max_new_tokens"]) for r in read_rows(d)}
            for d, s in zip((run_dir, other_dir), settings)]
    theirs_names = {name for _, name in rows[1]}
    methods = [m for m in dict.fromkeys(name for _, name in rows[0]) if m in theirs_names]
    if not methods:
        raise ValueError(f"{run_dir} and {other_dir} have no method in common")
    differ = {k: [settings[0].get(k), settings[1].get(k)] for k in sorted(set(settings[0]) | set(settings[1]))
              if settings[0].get(k) != settings[1].get(k)}
    out = {"runs": [str(run_dir), str(other_dir)], "grader": grader, "differ": differ, "methods": {}}
    for m in methods:
        ids = sorted(i for i, name in rows[0] if name == m and (i, m) in rows[1])
        mine, theirs = [[r[(i, m)] for i in ids] for r in rows]
        out["methods"][m] = {
            "problems": len(ids),
            "accuracy": [accuracy([r["grades"][grader] for r in rs]) for rs in (mine, theirs)],
            **mcnemar([t["grades"][grader] for t in theirs], [r["grades"][grader] for r in mine]),
            "identical": sum(a["output"] == b["output"] for a, b in zip(mine, theirs)),
        }
    return out


def against_markdown(summary: dict) -> str:
    """The side-by-side table, with the settings that differ between the runs."""
    a, b = summary["runs"]
    lines = [f"# {a} against {b}", "",
             f"- grade: {summary['grader']}; p = exact McNemar test (paired, two-sided) between the runs",
             "- settings that differ: " + ("; ".join(f"{k}: {v[0]} here, {v[1]} there"
                                                     for k, v in summary["differ"].items()) or "none"),
             "", f"| method | problems | {a} | {b} | only here | only there | p | identical outputs |",
             "|---|---|---|---|---|---|---|---|"]
    for name, m in summary["methods"].items():
        here, there = (format_accuracy(acc) for acc in m["accuracy"])
        lines.append(f"| {name} | {m['problems']} | {here} | {there} | {m['only_method']} | "
                     f"{m['only_reference']} | {m['p_value']:.3f} | {m['identical']}/{m['problems']} |")
    return "\n".join(lines) + "\n"
