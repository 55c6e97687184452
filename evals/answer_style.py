"""How each GSM8K answer is written, a Python program or prose, and what that does to a paired comparison.

A rule can move accuracy by changing how the model writes rather than how well it reasons: the Qwen coder
models often answer with a program and then invent the program's printed output. This module tabulates, per
method, how often it wrote a program and its accuracy by style, and splits the paired wins and losses against a
reference by the pair of styles. Where the rows carry the ``program_run`` grade (GSM8K; see `evals.grading`), it
also sets each method against the reference with every program run, to tell a wrong program from a right one
whose output the model made up.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from .benchmarks import get_benchmark
from .grading import program_of
from .paired import accuracy_difference, as_points, by_problem
from .rows import read_rows
from .summary import mcnemar

STYLES = ("program", "prose")


def style_of(output: str) -> str:
    """``"program"`` when the answer has a fenced Python block, else ``"prose"``."""
    return "program" if program_of(output) is not None else "prose"


def graded_rows(run_dir: str | Path, methods: set[str] | None = None) -> list[dict]:
    """The run's rows (of ``methods`` only, if given) graded as `semverify report` grades them (today's graders, and
    an output cut off at the cap without a final answer is no answer), so the tables add up to the report's counts; a
    folder without ``run.json`` keeps the rows' stored grades. Grading runs GSM8K program answers, hence the
    progress bar."""
    rows, s = read_rows(run_dir), run_settings(run_dir)
    if methods is not None:
        rows = [row for row in rows if row["method"] in methods]
    if not s:
        return rows
    bench = get_benchmark(s["benchmark"])
    return [bench.regrade(row, s["max_new_tokens"]) for row in tqdm(rows, desc="grade", unit="row")]


def run_settings(run_dir: str | Path) -> dict:
    """The settings ``run.json`` records, or {} for a folder of rows without one."""
    path = Path(run_dir) / "run.json"
    return json.loads(path.read_text())["settings"] if path.exists() else {}


def style_table(run_dir: str | Path, reference: str, methods: list[str], grader: str = "math_verify") -> dict:
    """Per method, over the (problem, sample) pairs every named method and the reference share: outputs, share
    written as programs, accuracy by style; against ``reference``, wins and losses keyed ``"<reference style> ->
    <method style>"``. Where the rows have a ``program_run`` grade, also each method's accuracy with its programs
    run (prose answers keep their grade) and its paired difference, interval and McNemar p against the reference
    graded the same way."""
    by: dict[str, dict[tuple, dict]] = {}
    for row in graded_rows(run_dir):
        by.setdefault(row["method"], {})[row["id"], row.get("sample", 0)] = row
    names = [reference, *(m for m in methods if m != reference)]
    missing = [m for m in names if m not in by]
    if missing:
        raise ValueError(f"no rows of {missing} in {run_dir}; it has {sorted(by)}")
    keys = sorted(set.intersection(*(set(by[m]) for m in names)))
    if not keys:
        raise ValueError(f"{names} share no (problem, sample) in {run_dir}")
    styles = {m: [style_of(by[m][k]["output"]) for k in keys] for m in names}
    grades = {m: [bool(by[m][k]["grades"][grader]) for k in keys] for m in names}
    result: dict = {"run": str(run_dir), "reference": reference, "grader": grader, "outputs": len(keys),
                    "problems": [keys[0][0], keys[-1][0]], "methods": {}}
    programs_run = all("program_run" in by[m][k]["grades"] for m in names for k in keys)
    if programs_run:
        run_grades = {m: [bool(by[m][k]["grades"]["program_run"]) for k in keys] for m in names}
    for method in names:
        entry: dict = {"program_share": styles[method].count("program") / len(keys), "by_style": {}}
        for style in STYLES:
            chosen = [g for g, s in zip(grades[method], styles[method]) if s == style]
            entry["by_style"][style] = {"outputs": len(chosen), "correct": sum(chosen)}
        if programs_run:
            entry["by_style"]["program"]["correct_when_run"] = sum(
                g for g, s in zip(run_grades[method], styles[method]) if s == "program")
            entry["correct_with_programs_run"] = sum(run_grades[method])
        if method != reference:
            pairs: Counter = Counter()
            for ref_style, style, ref_grade, grade in zip(styles[reference], styles[method], grades[reference],
                                                          grades[method]):
                if grade != ref_grade:
                    pairs[f"{ref_style} -> {style}", "won" if grade else "lost"] += 1
            entry["paired"] = {pair: {"won": pairs[pair, "won"], "lost": pairs[pair, "lost"]}
                               for pair in sorted({p for p, _ in pairs})}
            if programs_run:
                entry["paired_with_programs_run"] = paired_difference(keys, run_grades[method], run_grades[reference])
        result["methods"][method] = entry
    return result


def paired_difference(keys: list[tuple], method: list[bool], reference: list[bool]) -> dict:
    """Difference in points with its 95% bootstrap interval over problems, wins, losses and McNemar's p."""
    d = accuracy_difference(by_problem(keys, method), by_problem(keys, reference))
    test = mcnemar(reference, method)
    return {"difference": 100 * d["difference"], "low": 100 * d["low"], "high": 100 * d["high"],
            "won": test["only_method"], "lost": test["only_reference"], "p_value": test["p_value"]}


def markdown(table: dict) -> str:
    """The two tables of `style_table`'s result: accuracy by style, and paired outcomes by pair of styles."""
    programs_run = any("correct_with_programs_run" in e for e in table["methods"].values())
    lines = [f"Answer style over {table['outputs']} outputs (problems {table['problems'][0]}-{table['problems'][1]}),"
             f" graded by {table['grader']}", "",
             "| method | programs | program accuracy | prose accuracy |"
             + (" programs right when run | correct, programs run |" if programs_run else ""),
             "|---|---|---|---|" + ("---|---|" if programs_run else "")]
    for method, e in table["methods"].items():
        prog, prose = e["by_style"]["program"], e["by_style"]["prose"]
        cells = [method, f"{prog['outputs']} ({100 * e['program_share']:.0f}%)",
                 f"{prog['correct']}/{prog['outputs']}", f"{prose['correct']}/{prose['outputs']}"]
        if programs_run:
            cells += [f"{prog['correct_when_run']}/{prog['outputs']}", f"{e['correct_with_programs_run']}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Paired against `{table['reference']}`, by (its style -> the method's style): won / lost", "",
              "| method | styles | won | lost | net |", "|---|---|---|---|---|"]
    for method, e in table["methods"].items():
        for pair, c in e.get("paired", {}).items():
            lines.append(f"| {method} | {pair} | {c['won']} | {c['lost']} | {c['won'] - c['lost']:+d} |")
    if programs_run:
        lines += ["", f"Paired against `{table['reference']}` with every program run (prose answers keep their grade)",
                  "", "| method | difference [95% bootstrap] | won | lost | McNemar p |", "|---|---|---|---|---|"]
        for method, e in table["methods"].items():
            if "paired_with_programs_run" in e:
                d = e["paired_with_programs_run"]
                lines.append(f"| {method} | {as_points(d['difference'], d['low'], d['high'], scale=1)} | {d['won']} |"
                             f" {d['lost']} | {d['p_value']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """``python -m evals.answer_style RUN_DIR --reference R --methods A,B [--out DIR]``: prints the
    tables and writes answer-style.md and .json to DIR (default RUN_DIR); ``--answers FILE`` counts a JSONL's
    program answers instead."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m evals.answer_style", description=main.__doc__)
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--reference", default="vanilla")
    parser.add_argument("--methods", default="", help="comma-separated methods to set against the reference")
    parser.add_argument("--grader", default="math_verify")
    parser.add_argument("--answers", help="a JSONL with an 'answer' per line (a SENSE store's source): count programs")
    parser.add_argument("--out", help="the folder for answer-style.md and .json (default: the run folder)")
    args = parser.parse_args(argv)
    if args.answers:
        answers = [json.loads(line)["answer"] for line in Path(args.answers).read_text().splitlines() if line.strip()]
        programs = sum(style_of(a) == "program" for a in answers)
        share = 100 * programs / len(answers)
        print(f"{args.answers}: {programs} of {len(answers)} answers are programs ({share:.0f}%)")
        return
    if not args.run_dir:
        parser.error("give a run folder, or --answers FILE")
    table = style_table(args.run_dir, args.reference, [m for m in args.methods.split(",") if m], args.grader)
    out = Path(args.out or args.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "answer-style.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "answer-style.md").write_text(markdown(table))
    print(markdown(table), end="")


if __name__ == "__main__":
    main()
