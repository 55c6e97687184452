"""The statistics of a run folder: per-method accuracy with Wilson intervals, speedups against a reference
(per machine), exact McNemar tests and paired differences, acceptance by draft position and rule events."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from scipy.stats import binomtest
from tqdm import tqdm

from semverify.methods import Method
from semverify.registry import RunContext

from .benchmarks import get_benchmark
from .margins import lossless_differences
from .paired import accuracy_difference, by_problem, divergence
from .rows import read_rows


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for k successes in n trials (sound at 0 and n, unlike the normal one)."""
    if n == 0:
        return 0.0, 0.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar(a: list[bool], b: list[bool]) -> dict:
    """Exact McNemar test on paired grades: only problems where the two methods disagree count."""
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    n = only_a + only_b
    p = binomtest(only_a, n, 0.5).pvalue if n else 1.0
    return {"only_method": only_b, "only_reference": only_a, "p_value": p}


def summarise(run_dir: str | Path, reference: str = "vanilla", grader: str | None = None,
              paired: list[str] | None = None, only: list[str] | None = None,
              leave_out: frozenset[int] = frozenset()) -> dict:
    """Per-method metrics over the problems every method (of ``only``, default all) finished: speedups
    against ``reference`` and exact McNemar tests against each method in ``paired`` (default: the
    reference) on ``grader`` (default: the benchmark's main grade). ``leave_out``: problem ids not counted
    (e.g. those a threshold was chosen on)."""
    run_dir = Path(run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    methods = [Method.from_record(m) for m in run["methods"]]
    s = run["settings"]
    context = RunContext.for_decoding(s["draft"], s["target"], s["do_sample"], s["temperature"])
    names = [m.name for m in methods]
    paired = paired or [reference]
    for name in (reference, *paired, *(only or [])):
        if name not in names:
            raise ValueError(f"method {name!r} is not in this run ({', '.join(names)})")
    if only:
        methods = [m for m in methods if m.name in {*only, reference, *paired}]
        names = [m.name for m in methods]
    bench = get_benchmark(s["benchmark"])
    # keyed by output: (problem, sample), then method
    by = {((r["id"], r.get("sample", 0)), r["method"]): r for r in read_rows(run_dir)
          if r["method"] in names and r["id"] not in leave_out}
    ids = sorted({i for i, _ in by if all((i, m) in by for m in names)})
    if not ids:
        counts = ", ".join(f"{m}: {sum(k[1] == m for k in by)}" for m in names)
        raise ValueError(f"no problem has a row for every method (rows per method: {counts}); "
                         "choose the methods to report with --methods")
    # rows from before rows recorded their machine ran on the run's one machine, unless it moved
    cpus = run_cpus(run)
    only_cpu = cpus[0] if len(cpus) == 1 and cpus[0] != "?" else None
    finished = set(ids)
    # graded once (GSM8K's program_run runs the program answers, hence the progress bar)
    to_grade = [(k, r) for k, r in by.items() if k[0] in finished]
    uncapped = {k: bench.regrade(r)["grades"] for k, r in tqdm(to_grade, desc="grade", unit="row", leave=False)}
    by = {k: {**r, "grades": bench.cut_at_cap(uncapped[k], r["output"], r.get("new_tokens", 0) >= s["max_new_tokens"]),
              "machine": r.get("machine", only_cpu)}
          for k, r in by.items() if k[0] in finished}
    batched = (s.get("batch_size") or 1) > 1
    grader = grader or bench.main_grader
    if grader not in bench.graders:
        raise ValueError(f"{s['benchmark']} is graded by {', '.join(bench.graders)}, not {grader!r}")
    out = {"run": run, "problems": len({pid for pid, _ in ids}), "outputs": len(ids), "reference": reference,
           "paired": paired, "grader": grader, "left_out": sorted(leave_out),
           "graders": list(bench.graders), "batched": batched, "methods": {}}
    for m in methods:
        rs = [by[(i, m.name)] for i in ids]
        steps = sum(r["steps"] for r in rs)
        drafted = sum(r["drafted"] for r in rs)
        # a timing ratio only within one machine (rows of unknown machine in a run that moved are left out)
        timed = [i for i in ids if by[(i, m.name)].get("machine") is not None
                 and by[(i, m.name)].get("machine") == by[(i, reference)].get("machine")]
        ratios = [by[(i, m.name)]["tok_s"] / by[(i, reference)]["tok_s"] for i in timed]
        per_machine: dict[str, list[int]] = {}
        for i in timed:
            per_machine.setdefault(by[(i, reference)]["machine"], []).append(i)
        reference_throughput = _throughput([by[(i, reference)] for i in timed])
        speedup_total = _throughput([by[(i, m.name)] for i in timed]) / reference_throughput if timed else 0.0
        entry = {
            "lossless": _lossless(m, context), "problems": len(rs),
            "accuracy": {g: accuracy([r["grades"][g] for r in rs]) for g in bench.graders},
            "by_group": {key: _by_group(rs, key, grader) for key in bench.groups},
            "tau": sum(r["new_tokens"] for r in rs) / steps if steps else 0.0,
            "alpha": sum(r["accepted"] for r in rs) / drafted if drafted else None,
            "tok_s_median": statistics.median(r["tok_s"] for r in rs) if rs else 0.0,
            "speedup_median": statistics.median(ratios) if ratios else 0.0,
            "speedup_total": speedup_total,
            "speedup": speedup_total if batched else (statistics.median(ratios) if ratios else 0.0),
            "speedup_problems": len(timed),
            "speedup_by_machine": {name: machine_timing([by[(i, m.name)] for i in on],
                                                         [by[(i, reference)] for i in on])
                                   for name, on in per_machine.items()},
            "wall_s": sum(r["total_time"] for r in rs),
            "acceptance_by_position": _by_position(rs),
            "reasons": _sum_reasons(rs),
            "reasons_per_position": _sum_reasons_per_position(rs),
            "new_tokens": sum(r["new_tokens"] for r in rs),
            "at_cap": sum(r["new_tokens"] >= s["max_new_tokens"] for r in rs),
            # rows whose grade the cap rule changed: cut off without a final answer, yet the last number matched
            "cap_regraded": sum(uncapped[(i, m.name)][grader] != r["grades"][grader] for i, r in zip(ids, rs)),
            "drafted": drafted,
            "drafted_per_position": _sum_lists(r["drafted_per_position"] for r in rs),
            "scores": _score_summary(rs),
            "substitutions": _substitutions(rs, [by[(i, reference)] for i in ids], grader),
        }
        entry["paired"] = {}
        for other in paired:
            if other != m.name:
                theirs = [by[(i, other)] for i in ids]
                mine, their_grades = [r["grades"][grader] for r in rs], [t["grades"][grader] for t in theirs]
                entry["paired"][other] = {
                    **mcnemar(their_grades, mine),
                    "identical": sum(t["output"] == r["output"] for t, r in zip(theirs, rs)),
                    "difference": accuracy_difference(by_problem(ids, mine), by_problem(ids, their_grades)),
                    "divergence": divergence(rs, theirs, grader),
                }
                if other == reference and entry["lossless"]:
                    entry["paired"][other]["lossless_differences"] = lossless_differences(rs, theirs, ids)
        out["methods"][m.name] = entry
    if "accuracy" not in run:
        return out
    out["machine_time"] = machine_time(run_dir, run, list(out["methods"]))
    return _speed_from_timed_pass(out, run_dir, reference, grader, only, leave_out)


def machine_time(run_dir: Path, run: dict, methods: list[str]) -> dict[str, dict]:
    """Per method of an accuracy-mode run: the outputs it decoded so far (all its rows), the hours they took (each
    batch's wall time once, as measured, whatever else ran beside it), outputs per hour, and the hours the outputs
    still missing to reach ``--limit`` x samples would take at that pace: what a run of this size costs."""
    s = run["settings"]
    planned = s["limit"] * (s.get("samples") or 1) if s.get("limit") else None
    rows = [r for r in read_rows(run_dir) if r["method"] in methods]
    out = {}
    for name in methods:
        mine = [r for r in rows if r["method"] == name]
        hours = sum(_seconds(r) for r in mine) / 3600
        rate = len(mine) / hours if hours else None
        left = None if planned is None else max(planned - len(mine), 0)
        out[name] = {"outputs": len(mine), "hours": hours, "per_hour": rate, "left": left,
                     "hours_left": left / rate if rate and left is not None else None}
    return out


SPEED = ("tok_s_median", "speedup_median", "speedup_total", "speedup", "speedup_problems", "speedup_by_machine")


def _speed_from_timed_pass(out: dict, run_dir: Path, reference: str, grader: str, only: list[str] | None,
                           leave_out: frozenset[int]) -> dict:
    """An accuracy-mode run's rows are untimed: its speeds are those of its timed pass (``OUT/timed``, batch 1)
    over the problems that pass finished for every method, or none."""
    folder = run_dir / "timed"
    try:
        timed = summarise(folder, reference, grader, only=only, leave_out=leave_out) \
            if (folder / "run.json").is_file() else None
    except ValueError:  # no timed problem has a row for every method yet
        timed = None
    untimed = {"tok_s_median": 0.0, "speedup_median": 0.0, "speedup_total": 0.0, "speedup": 0.0,
               "speedup_problems": 0, "speedup_by_machine": {}}
    for name, m in out["methods"].items():
        source = timed["methods"].get(name) if timed else None
        m.update({key: source[key] for key in SPEED} if source else untimed)
    settings = timed["run"]["settings"] if timed else None
    out["timed"] = {"problems": timed["problems"], "dtype": settings["dtype"],
                    "throughput": _throughput_gain(run_dir, folder, list(out["methods"]), leave_out)} if timed else None
    out["batched"] = False  # speedups, where there are any, are batch-1 ratios
    return out


def _throughput_gain(run_dir: Path, timed_dir: Path, methods: list[str], leave_out: frozenset[int]) -> dict[str, dict]:
    """Per method, problems per hour in the accuracy pass (batched, each row charged its share of its batch's
    wall time) and in the timed pass (one at a time), over the problems both passes decoded for every method
    (first samples)."""
    batched = {(r["id"], r["method"]): r for r in read_rows(run_dir) if r.get("sample", 0) == 0}
    timed = {(r["id"], r["method"]): r for r in read_rows(timed_dir)}
    both = {i for i, _ in batched if i not in leave_out and all((i, m) in batched and (i, m) in timed for m in methods)}
    if not both:
        return {}
    out = {}
    for name in methods:
        fast = len(both) * 3600 / max(sum(_seconds(batched[(i, name)]) for i in both), 1e-9)
        slow = len(both) * 3600 / max(sum(_seconds(timed[(i, name)]) for i in both), 1e-9)
        out[name] = {"problems": len(both), "accuracy_per_hour": fast, "timed_per_hour": slow, "gain": fast / slow}
    return out


def machine_timing(rows: list[dict], reference_rows: list[dict]) -> dict:
    """A method's timing on one machine: the median per-problem speedup, and the arithmetic behind it: a
    step's draft, verification and other time, and one drafted token's, in units of the reference's time
    per token on the same problem (so tau / the step's cost is about the pooled speedup), and the part of the
    draft time spent on tokens that were not kept: the most a rule that rejects before drafting could save."""
    out = {"median": statistics.median(r["tok_s"] / ref["tok_s"] for r, ref in zip(rows, reference_rows)),
           "problems": len(rows)}
    steps, drafted = sum(r["steps"] for r in rows), sum(r["drafted"] for r in rows)
    if not steps or not all("draft_time" in r and "verify_time" in r for r in rows):
        return out
    units = [ref["total_time"] / max(ref["new_tokens"], 1) for ref in reference_rows]
    draft = sum(r["draft_time"] / u for r, u in zip(rows, units))
    verify = sum(r["verify_time"] / u for r, u in zip(rows, units))
    other = sum((r["total_time"] - r["draft_time"] - r["verify_time"]) / u for r, u in zip(rows, units))
    out["step_cost"] = {"draft": draft / steps, "verify": verify / steps, "other": other / steps}
    out["draft_per_token"] = draft / drafted if drafted else None
    unkept = drafted - sum(r["accepted"] for r in rows)
    out["unkept_draft"] = out["draft_per_token"] * unkept / steps if drafted else 0.0
    out["tau"] = sum(r["new_tokens"] for r in rows) / steps
    return out


def _by_group(rows: list[dict], key: str, grader: str) -> dict[str, dict]:
    """Accuracy per value of a problem's ``meta[key]`` (MATH-500's subject or level)."""
    values = sorted({str(r.get("meta", {}).get(key)) for r in rows})
    return {v: accuracy([r["grades"][grader] for r in rows if str(r.get("meta", {}).get(key)) == v]) for v in values}


def _throughput(rows: list[dict]) -> float:
    """Total new tokens per second over ``rows``: a batched row is charged its batch's wall time in
    proportion to its tokens, so rows that shared a batch add up to that batch's time."""
    seconds = sum(map(_seconds, rows))
    return sum(r["new_tokens"] for r in rows) / seconds if seconds else 0.0


def _seconds(row: dict) -> float:
    """A row's decoding time: its own, or for a batched row its batch's wall time in proportion to its tokens."""
    if "batch" in row:
        return row["batch"]["wall"] * row["new_tokens"] / max(row["batch"]["tokens"], 1)
    return row["total_time"]


def _lossless(method: Method, context: RunContext) -> bool | None:
    """Whether the method keeps the target's distribution; None when its rule cannot be built here (its
    probe or calibration files are gone)."""
    try:
        return method.lossless(context)
    except (ValueError, FileNotFoundError):
        return None


def accuracy(grades: list[bool]) -> dict:
    """Share correct with its 95% Wilson interval."""
    k, n = sum(grades), len(grades)
    lo, hi = wilson(k, n)
    return {"correct": k, "n": n, "acc": k / n if n else 0.0, "ci95": [lo, hi]}


def _sum_lists(lists) -> list[int]:
    """Element-wise sum of lists of different lengths."""
    total: list[int] = []
    for add in lists:
        total.extend([0] * (len(add) - len(total)))
        for i, c in enumerate(add):
            total[i] += c
    return total


def _by_position(rows: list[dict]) -> list[float]:
    drafted = _sum_lists(r["drafted_per_position"] for r in rows)
    accepted = _sum_lists(r["accepted_per_position"] for r in rows)
    accepted.extend([0] * (len(drafted) - len(accepted)))
    return [a / d for a, d in zip(accepted, drafted) if d]


def _sum_reasons_per_position(rows: list[dict]) -> dict[str, list[int]]:
    names = {k for r in rows for k in r.get("reasons_per_position", {})}
    return {k: _sum_lists(r.get("reasons_per_position", {}).get(k, []) for r in rows) for k in sorted(names)}


def _score_summary(rows: list[dict]) -> dict[str, dict]:
    """Quantiles of each per-step score a rule reported (e.g. SemanticSpec's step_ratio), over all steps;
    a 0/1 score (e.g. step_accepted) is summarised as a count."""
    names = sorted({k for r in rows for k in r.get("scores", {})})
    out = {}
    for name in names:
        values = sorted(v for r in rows for v in r.get("scores", {}).get(name, []))
        if values and set(values) <= {0.0, 1.0}:
            out[name] = {"n": len(values), "ones": int(sum(values))}
        elif values:
            deciles = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else values * 9
            out[name] = {"n": len(values), "min": values[0], "p10": deciles[0], "median": deciles[4],
                         "p90": deciles[8], "max": values[-1],
                         "share_below_1": sum(v < 1 for v in values) / len(values)}
    return out


def _substitutions(rows: list[dict], reference_rows: list[dict], grader: str) -> dict | None:
    """What a lossy rule kept instead of the target's own token, over the rows that logged it: how often,
    how often a digit was involved (a changed number can change the answer), the commonest pairs, and how
    many problems with a digit substitution the reference solved and this method did not."""
    logged = [(r, ref) for r, ref in zip(rows, reference_rows) if "substitutions" in r]
    subs = [s for r, _ in logged for s in r["substitutions"]]
    if not subs:
        return None
    digit = [any(c.isdigit() for c in s["kept"] + s["target"]) for s in subs]
    with_digit = [(r, ref) for r, ref in logged
                  if any(any(c.isdigit() for c in s["kept"] + s["target"]) for s in r["substitutions"])]
    pairs: dict[tuple[str, str], int] = {}
    for s in subs:
        pairs[(s["kept"], s["target"])] = pairs.get((s["kept"], s["target"]), 0) + 1
    return {"rows": len(logged), "count": len(subs), "new_tokens": sum(r["new_tokens"] for r, _ in logged),
            "digits": sum(digit), "problems_with_digit": len(with_digit),
            "lost_with_digit": sum(ref["grades"][grader] and not r["grades"][grader] for r, ref in with_digit),
            "common": sorted(pairs.items(), key=lambda kv: -kv[1])[:5]}


def _sum_reasons(rows: list[dict]) -> dict:
    total: dict[str, int] = {}
    for r in rows:
        for k, v in r["reasons"].items():
            total[k] = total.get(k, 0) + v
    return total


def run_cpus(run: dict) -> list[str]:
    """The machine that started the run, then any others that added methods or resumed it."""
    envs = [run.get("environment", {}), *(a["environment"] for a in run.get("added", [])), *run.get("resumed", [])]
    return list(dict.fromkeys(e.get("cpu", "?") for e in envs))
