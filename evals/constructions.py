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
        if method not in new:
            raise ValueError(f"{method!r} has no rows in {new_dir} (it has {sorted(new)})")
        before = old.get(method)  # None: the old construction never ran it (new - reference only)
        keys = sorted(set(new[method]) & set(old[reference]) & (set(before) if before else set(new[method])))
        if not keys:
            raise ValueError(f"{method!r} has no (problem, sample) in both runs and the reference")
        sides = (("old", before), ("new", new[method]), ("reference", old[reference]))
        grade = {name: [bool(rows[k]["grades"][grader]) for k in keys] for name, rows in sides if rows}
        paired = {name: by_problem(keys, grade[name]) for name in grade}
        entry = {"outputs": len(keys), "problems": [keys[0][0], keys[-1][0]], "old_rows": before is not None,
                 "correct": {name: sum(grade[name]) if name in grade else None for name, _ in sides},
                 "tau": {name: _mean([rows[k]["tau"] for k in keys if rows[k].get("tau")]) if rows else None
                         for name, rows in sides[:2]},
                 "identical": sum(before[k]["output_ids"] == new[method][k]["output_ids"] for k in keys)
                 if before else None}
        for label, a, b in (("new - old", "new", "old"), ("old - reference", "old", "reference"),
                            ("new - reference", "new", "reference")):
            if a not in grade or b not in grade:
                entry[label] = None
                continue
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
        cells = ["- (no old rows)" if e[label] is None else as_points(e[label]["difference"], e[label]["low"],
                                                                      e[label]["high"])
                 + f" ({e[label]['discordant']} differ)" for label in labels]
        taus = " / ".join("-" if v is None else f"{v:.2f}" for v in (t["old"], t["new"]))
        same = "-" if e["identical"] is None else f"{e['identical']} of {e['outputs']}"
        correct = f"{'-' if c['old'] is None else c['old']} / {c['new']} ({c['reference']})"
        lines.append(f"| `{name}` | {e['problems'][0]}-{e['problems'][1]} ({e['outputs']}) | {correct} | "
                     f"{' | '.join(cells)} | {same} | {taus} |")
    if any(not e["old_rows"] for e in result["methods"].values()):
        lines += ["", "A method without old rows never ran under the old construction on these problems: it is "
                  "measured against the reference only."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m evals.constructions", description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="run folder of the old construction (its reference rows are used)")
    parser.add_argument("new", help="run folder of the new construction")
    parser.add_argument("--methods", required=True,
                        help="comma-separated methods of the new run (those the old run lacks: against the reference)")
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
