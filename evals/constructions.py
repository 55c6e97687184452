"""Old against new coupled construction, rule by rule: the same problems, the same noise, two constructions.

Rows drawn under coupling 1 (each rule's own coupled branch) and coupling 2 (the engine draws each rule's emitted
law) are never pooled; this module sets them side by side instead. For each method it takes the problems both runs
have, and gives each construction's accuracy, the paired difference new - old (95% bootstrap interval over
problems), each against the reference (a lossless method, the same under both constructions, read from the old
run), how many outputs are token-identical, and tau:

    python -m evals.constructions results/gsm8k-500 results/gsm8k-500-coupling2 --methods easd,mars \\
        --out results/gsm8k-500-coupling2/constructions
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .answer_style import graded_rows, run_settings
from .paired import accuracy_difference, as_points, by_problem


def _by_key(rows: list[dict]) -> dict[str, dict[tuple, dict]]:
    out: dict[str, dict[tuple, dict]] = {}
    for row in rows:
        out.setdefault(row["method"], {})[row["id"], row.get("sample", 0)] = row
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def side_by_side(old_dir: str | Path, new_dir: str | Path, methods: list[str], reference: str = "vanilla",
                 grader: str = "math_verify") -> dict:
    """Per method, over the (problem, sample) pairs both runs and the reference have: each construction's correct
    count and tau, new - old and each - reference as paired differences with 95% intervals, and the share of
    token-identical outputs."""
    old_s, new_s = run_settings(old_dir), run_settings(new_dir)
    versions = (old_s.get("coupling") or 1, new_s.get("coupling") or 1)
    wanted = {*methods, reference}
    old, new = _by_key(graded_rows(old_dir, wanted)), _by_key(graded_rows(new_dir, wanted))
    if reference not in old:
        raise ValueError(f"no rows of the reference {reference!r} in {old_dir}")
    result: dict = {"old": str(old_dir), "new": str(new_dir), "couplings": list(versions), "reference": reference,
                    "grader": grader, "methods": {}}
    for method in methods:
        if method not in old or method not in new:
            raise ValueError(f"{method!r} needs rows in both runs ({old_dir}: {sorted(old)}; {new_dir}: {sorted(new)})")
        keys = sorted(set(old[method]) & set(new[method]) & set(old[reference]))
        if not keys:
            raise ValueError(f"{method!r} has no (problem, sample) in both runs and the reference")
        grade = {name: [bool(rows[k]["grades"][grader]) for k in keys]
                 for name, rows in (("old", old[method]), ("new", new[method]), ("reference", old[reference]))}
        paired = {name: by_problem(keys, grade[name]) for name in grade}
        entry = {"outputs": len(keys), "problems": [keys[0][0], keys[-1][0]],
                 "correct": {name: sum(g) for name, g in grade.items()},
                 "tau": {"old": _mean([old[method][k]["tau"] for k in keys if old[method][k].get("tau")]),
                         "new": _mean([new[method][k]["tau"] for k in keys if new[method][k].get("tau")])},
                 "identical": sum(old[method][k]["output_ids"] == new[method][k]["output_ids"] for k in keys)}
        for label, a, b in (("new - old", "new", "old"), ("old - reference", "old", "reference"),
                            ("new - reference", "new", "reference")):
            d = accuracy_difference(paired[a], paired[b])
            entry[label] = {"difference": d["difference"], "low": d["low"], "high": d["high"],
                            "discordant": sum(x != y for x, y in zip(grade[a], grade[b]))}
        result["methods"][method] = entry
    return result


def markdown(result: dict) -> str:
    """The side-by-side table."""
    old, new = result["couplings"]
    lines = [f"Coupling {old} (`{result['old']}`) against coupling {new} (`{result['new']}`), graded by "
             f"{result['grader']}; reference `{result['reference']}` (lossless: the same under both). Differences "
             "are paired over the problems both runs have, in points, with 95% bootstrap intervals.", "",
             "| method | problems | correct old / new (reference) | new - old | old - reference | new - reference "
             "| identical outputs | tau old / new |", "|---|---|---|---|---|---|---|---|"]
    for name, e in result["methods"].items():
        c, t = e["correct"], e["tau"]
        labels = ("new - old", "old - reference", "new - reference")
        cells = [as_points(e[label]["difference"], e[label]["low"], e[label]["high"])
                 + f" ({e[label]['discordant']} differ)" for label in labels]
        taus = " / ".join("-" if v is None else f"{v:.2f}" for v in (t["old"], t["new"]))
        lines.append(f"| `{name}` | {e['problems'][0]}-{e['problems'][1]} ({e['outputs']}) | {c['old']} / {c['new']} "
                     f"({c['reference']}) | {' | '.join(cells)} | {e['identical']} of {e['outputs']} | {taus} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m evals.constructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="run folder of the old construction (its reference rows are used)")
    parser.add_argument("new", help="run folder of the new construction")
    parser.add_argument("--methods", required=True, help="comma-separated methods both runs have")
    parser.add_argument("--reference", default="vanilla")
    parser.add_argument("--grader", default="math_verify")
    parser.add_argument("--out", help="write OUT.md and OUT.json (default: print the table)")
    args = parser.parse_args(argv)
    result = side_by_side(args.old, args.new, [m for m in args.methods.split(",") if m], args.reference, args.grader)
    table = markdown(result)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=2))
        Path(f"{args.out}.md").write_text(table)
    print(table, end="")


if __name__ == "__main__":
    main()
