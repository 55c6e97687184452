"""``semverify report RUN_DIR``: a Markdown table, a paired test against a reference, and plots."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from scipy.stats import binomtest

from semverify.registry import Method, RunContext

from .benchmarks import get_benchmark
from .margins import MARGINS_FILE, compute_margins, lossless_differences
from .paired import accuracy_difference, divergence, problems_needed
from .rows import read_rows

POSITIONS = 10  # draft positions listed in the rule-event lines (step drafts have up to 128)


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
              paired: list[str] | None = None, only: list[str] | None = None) -> dict:
    """Per-method metrics over the problems every method (of ``only``, default all) finished: speedups
    against ``reference`` and exact McNemar tests against each method in ``paired`` (default: the
    reference) on ``grader`` (default: the benchmark's main grade)."""
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
    by = {((r["id"], r.get("sample", 0)), r["method"]): r for r in read_rows(run_dir) if r["method"] in names}
    ids = sorted({i for i, _ in by if all((i, m) in by for m in names)})
    if not ids:
        counts = ", ".join(f"{m}: {sum(k[1] == m for k in by)}" for m in names)
        raise ValueError(f"no problem has a row for every method (rows per method: {counts}); "
                         "choose the methods to report with --methods")
    # rows from before rows recorded their machine ran on the run's one machine, unless it moved
    cpus = _run_cpus(run)
    only_cpu = cpus[0] if len(cpus) == 1 and cpus[0] != "?" else None
    finished = set(ids)
    uncapped = {k: bench.regrade(r)["grades"] for k, r in by.items() if k[0] in finished}  # graded once
    by = {k: {**r, "grades": bench.cut_at_cap(uncapped[k], r["output"], r.get("new_tokens", 0) >= s["max_new_tokens"]),
              "machine": r.get("machine", only_cpu)}
          for k, r in by.items() if k[0] in finished}
    batched = (s.get("batch_size") or 1) > 1
    grader = grader or bench.main_grader
    if grader not in bench.graders:
        raise ValueError(f"{s['benchmark']} is graded by {', '.join(bench.graders)}, not {grader!r}")
    out = {"run": run, "problems": len({pid for pid, _ in ids}), "outputs": len(ids), "reference": reference,
           "paired": paired, "grader": grader,
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
                entry["paired"][other] = {
                    **mcnemar([t["grades"][grader] for t in theirs], [r["grades"][grader] for r in rs]),
                    "identical": sum(t["output"] == r["output"] for t, r in zip(theirs, rs)),
                    "difference": accuracy_difference(_per_problem(ids, rs, grader), _per_problem(ids, theirs, grader)),
                    "divergence": divergence(rs, theirs, grader),
                }
                if other == reference and entry["lossless"]:
                    entry["paired"][other]["lossless_differences"] = lossless_differences(rs, theirs, ids)
        out["methods"][m.name] = entry
    return out


def _per_problem(ids: list[tuple[int, int]], rows: list[dict], grader: str) -> dict[int, list[bool]]:
    """Each problem's grades, in sample order, from rows aligned with the (problem, sample) ``ids``."""
    out: dict[int, list[bool]] = {}
    for (pid, _), row in zip(ids, rows):
        out.setdefault(pid, []).append(row["grades"][grader])
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
    seconds = sum(r["batch"]["wall"] * r["new_tokens"] / max(r["batch"]["tokens"], 1) if "batch" in r
                  else r["total_time"] for r in rows)
    return sum(r["new_tokens"] for r in rows) / seconds if seconds else 0.0


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


def markdown(summary: dict) -> str:
    """The report table headed by the environment and decoding settings."""
    run, env = summary["run"], summary["run"].get("environment", {})
    s = run["settings"]
    decoding = (f"sampling T={s['temperature']} top_k={s['top_k']} top_p={s['top_p']}" if s["do_sample"]
                else "greedy")
    uses_draft = any(Method.from_record(m).needs & {"draft_model", "draft_model_int8"} for m in run["methods"])
    draft = f"draft `{s['draft']}`" if uses_draft else "no draft model"
    if s.get("datastore"):
        draft += f", datastore `{s['datastore']}`"
    speedup = (f"ratio of total tokens/s (batches of {s['batch_size']}: a problem's own time includes its batch's)"
               if summary.get("batched") else "median per-problem tokens/s ratio")
    lines = [
        f"# {s['benchmark']} comparison: {summary['problems']} problems",
        "",
        f"- target `{s['target']}`, {draft}, {s['dtype']}, {decoding}, seed {s['seed']}, "
        f"max {s['max_new_tokens']} new tokens, template `{s['template']}`, data `{s['data']}`",
        f"- machine: {_machines(run)}, {env.get('torch_threads', '?')} threads, torch {env.get('torch', '?')}, "
        f"transformers {env.get('transformers', '?')}; run started {env.get('date', '?')}",
        f"- accuracy with 95% Wilson intervals; speedup = {speedup} vs `{summary['reference']}`; p = exact McNemar "
        f"test (paired, two-sided) on {summary['grader']}; at cap = outputs that reached the "
        f"{s['max_new_tokens']}-token cap (a rule that makes the model ramble shows here)",
        "",
        "| method | lossless | " + " | ".join(g.replace("_", "-") for g in summary["graders"])
        + " | tau | alpha | tok/s | speedup | at cap | wall (s) | " + " | ".join(f"p vs {o}" for o in summary["paired"])
        + " |",
        "|---" * (8 + len(summary["graders"]) + len(summary["paired"])) + "|",
    ]
    for name, m in summary["methods"].items():
        accs = [format_accuracy(m["accuracy"][g]) for g in summary["graders"]]
        alpha = f"{m['alpha']:.2f}" if m["alpha"] is not None else "-"
        ps = [f"{m['paired'][o]['p_value']:.3f}" if o in m["paired"] else "-" for o in summary["paired"]]
        lossless = {True: "yes", False: "no", None: "?"}[m["lossless"]]
        lines.append(f"| {name} | {lossless} | {' | '.join(accs)} | {m['tau']:.2f} | "
                     f"{alpha} | {m['tok_s_median']:.2f} | {_speedup(m)} | {m['at_cap']} | {m['wall_s']:.0f} | "
                     + " | ".join(ps) + " |")
    partial = [(f"- speedup of `{name}` over {m['speedup_problems']} of {summary['problems']} problems: on the "
                f"others its row and `{summary['reference']}`'s ran on different machines") if m["speedup_problems"]
               else (f"- no speedup for `{name}` (nor a point in the plot): none of its rows ran on the machine of "
                     f"`{summary['reference']}`'s row for the same problem")
               for name, m in summary["methods"].items() if m["speedup_problems"] < summary["problems"]]
    return "\n".join(lines + ([""] + partial if partial else []) + _cap_regraded(summary) + _by_machine(summary)
                     + _time_per_step(summary)
                     + _identical(summary) + _lossless_differences(summary) + _differences(summary)
                     + _groups(summary) + _rule_events(summary)) + "\n"


def _cap_regraded(summary: dict) -> list[str]:
    """Which rows the cap rule regraded: cut off without a final answer, their last number matched the gold."""
    changed = {name: m["cap_regraded"] for name, m in summary["methods"].items() if m.get("cap_regraded")}
    if not changed:
        return ["", f"- no {summary['grader']} grade changed by the cap rule (an output cut off at the cap without a "
                "final answer is no answer)"]
    listed = ", ".join(f"`{name}` {n}" for name, n in changed.items())
    return ["", f"- graded wrong as cut off at the cap without a final answer (their last number matched): {listed} "
            f"row(s) on {summary['grader']}"]


def _time_per_step(summary: dict) -> list[str]:
    """Where each drafting method's time goes, per machine: a step's cost in the reference's time per token,
    so that tau / that cost explains the speedup (or its absence) on the machine that ran it."""
    if summary.get("batched"):
        return []
    lines = []
    for name, m in summary["methods"].items():
        for machine, t in m["speedup_by_machine"].items():
            if not t.get("draft_per_token"):
                continue
            cost = t["step_cost"]
            total = sum(cost.values())
            lines.append(f"| {name} | {machine} | {t['problems']} | {t['tau']:.2f} | {t['draft_per_token']:.2f} | "
                         f"{cost['draft']:.2f}+{cost['verify']:.2f}+{cost['other']:.2f} | {t['tau'] / total:.2f}x | "
                         f"{t['unkept_draft']:.2f} | {t['tau'] / (total - t['unkept_draft']):.2f}x |")
    if not lines:
        return []
    return ["", f"Time per step in units of `{summary['reference']}`'s time per token on the same problem (tau / step "
            "cost is about the pooled speedup; with a verification costing at least one token's time, 1 / one draft "
            "token bounds the speedup of any method drafting at that cost, however many of its drafts are accepted; "
            "the draft time of tokens not kept, and tau / the cost without it, bound what a rule could gain by "
            "rejecting a draft before it is written, e.g. a step at its first vetoed token):",
            "", "| method | machine | problems | tau | one draft token | step cost draft+verify+other | tau / cost "
            "| drafts not kept | tau / cost without them |",
            "|---|---|---|---|---|---|---|---|---|", *lines]


def _by_machine(summary: dict) -> list[str]:
    """Each method's median speedup on each machine, when the run's rows were timed on several: machines of
    one name can differ several-fold in what a wide forward costs, so the pooled median hides which is which."""
    if summary.get("batched"):
        return []
    machines = list(dict.fromkeys(name for m in summary["methods"].values() for name in m["speedup_by_machine"]))
    if len(machines) < 2:
        return []
    lines = ["", f"Speedup vs `{summary['reference']}` by machine (median per-problem ratio, problems):", "",
             "| method | " + " | ".join(machines) + " |", "|---" * (len(machines) + 1) + "|"]
    for name, m in summary["methods"].items():
        cells = [f"{m['speedup_by_machine'][c]['median']:.2f}x ({m['speedup_by_machine'][c]['problems']})"
                 if c in m["speedup_by_machine"] else "-" for c in machines]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _groups(summary: dict) -> list[str]:
    """A table per breakdown key (MATH-500: subject, level): each method's accuracy in each group."""
    lines = []
    methods = summary["methods"]
    for key in next(iter(methods.values()), {}).get("by_group", {}):
        groups = list(next(iter(methods.values()))["by_group"][key])
        lines += ["", f"{summary['grader']} accuracy by {key}:", "",
                  f"| {key} | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
        for g in groups:
            cells = [f"{m['by_group'][key][g]['correct']}/{m['by_group'][key][g]['n']}" for m in methods.values()]
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
    return lines


def _run_cpus(run: dict) -> list[str]:
    """The machine that started the run, then any others that added methods or resumed it."""
    envs = [run.get("environment", {}), *(a["environment"] for a in run.get("added", [])), *run.get("resumed", [])]
    return list(dict.fromkeys(e.get("cpu", "?") for e in envs))


def _machines(run: dict) -> str:
    cpus = _run_cpus(run)
    return cpus[0] + (f" (resumed on {', '.join(cpus[1:])})" if len(cpus) > 1 else "")


def _identical(summary: dict) -> list[str]:
    """Which methods wrote the same text as a paired one (e.g. a threshold that never bound)."""
    outputs = summary.get("outputs", summary["problems"])
    same = [f"`{name}` = `{other}` on {p['identical']} of {outputs}"
            for name, m in summary["methods"].items() for other, p in m["paired"].items() if p.get("identical")]
    return ["", "Identical outputs: " + "; ".join(same)] if same else []


def _lossless_differences(summary: dict) -> list[str]:
    """Each lossless method's outputs that differ from the reference's (none, in an exact run), with the
    target's top-2 logit margin at the first diverging token where ``--margins`` measured it."""
    lines = []
    for name, m in summary["methods"].items():
        diffs = m["paired"].get(summary["reference"], {}).get("lossless_differences")
        if diffs is None:
            continue
        if not diffs:
            lines.append(f"- `{name}` (lossless) equals `{summary['reference']}` token for token on every output")
            continue
        margins = summary.get("margins", {})
        listed = "; ".join(
            f"problem {d['id']} sample {d['sample']}"
            + (f" at token {d['position']}" if d["position"] is not None else " (no token ids in its rows)")
            + (f" (top-2 margin {margins[key]:.3g})" if (key := f"{name}/{d['id']}/{d['sample']}") in margins else "")
            for d in diffs[:20])
        more = f"; and {len(diffs) - 20} more" if len(diffs) > 20 else ""
        lines.append(f"- `{name}` (lossless) differs from `{summary['reference']}` on {len(diffs)} output(s): "
                     f"{listed}{more}")
    return [""] + lines if lines else []


def _differences(summary: dict) -> list[str]:
    """Each method's accuracy difference from the reference with its paired interval and divergence."""
    ref = summary["reference"]
    lines = []
    for name, m in summary["methods"].items():
        p = m["paired"].get(ref)
        if p is None or "difference" not in p:
            continue
        d, v = p["difference"], p["divergence"]
        at = "-" if v["median_first_divergence"] is None else f"{v['median_first_divergence']:.0f}"
        lines.append(f"| {name} | {100 * d['difference']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] | "
                     f"{d['discordant']} | {100 * d['detectable']:.1f} | {problems_needed(0.02, d['sd'])} | "
                     f"{v['identical']} of {v['outputs']} | {at} | {v['flips']} |")
    if not lines:
        return []
    return ["", f"Paired against `{ref}` on {summary['grader']} (points; 95% bootstrap interval over problems, samples "
            "nested; detectable = the difference this run finds with 80% power at its spread; for 2 pt = problems a "
            "2-point difference would need at that spread; first divergence = "
            "median token position among outputs that differ; flips = differing outputs whose grade changed):", "",
            "| method | difference | discordant problems | detectable | for 2 pt | identical outputs | "
            "first divergence | flips |", "|---|---|---|---|---|---|---|---|", *lines]


def _rule_events(summary: dict) -> list[str]:
    """Lines on how often each rule's own decisions (beyond exact/ratio acceptance) happened, by position."""
    lines = []
    for name, m in summary["methods"].items():
        for reason, count in sorted(m["reasons"].items()):
            if reason in ("exact", "ratio") or not m.get("new_tokens"):
                continue
            by_pos = m.get("reasons_per_position", {}).get(reason, [])
            shares = ", ".join(f"{100 * c / d:.1f}%"
                               for c, d in zip(by_pos[:POSITIONS], m["drafted_per_position"]) if d)
            shares += ", ..." if len(by_pos) > POSITIONS else ""
            lines.append(f"- `{name}` {reason}: {count} times, {100 * count / m['new_tokens']:.2f} per 100 new "
                         f"tokens, {100 * count / max(m['drafted'], 1):.2f}% of drafted tokens"
                         + (f"; by draft position: {shares}" if shares else ""))
    for name, m in summary["methods"].items():
        for score, q in m.get("scores", {}).items():
            if "ones" in q:
                lines.append(f"- `{name}` {score}: {q['ones']} of {q['n']} steps ({100 * q['ones'] / q['n']:.1f}%)")
                continue
            lines.append(f"- `{name}` {score} over {q['n']} steps: min {q['min']:.3g}, p10 {q['p10']:.3g}, "
                         f"median {q['median']:.3g}, p90 {q['p90']:.3g}, max {q['max']:.3g}"
                         + (f"; {100 * q['share_below_1']:.1f}% below 1" if score.endswith("ratio") else ""))
    for name, m in summary["methods"].items():
        sub = m.get("substitutions")
        if sub:
            common = ", ".join(f"{kept!r} for {own!r} ({n})" for (kept, own), n in sub["common"])
            lines.append(f"- `{name}` kept {sub['count']} tokens the target would not have chosen "
                         f"({100 * sub['count'] / max(sub['new_tokens'], 1):.2f} per 100 new tokens, over the "
                         f"{sub['rows']} problems that logged them); {sub['digits']} involve a digit, in "
                         f"{sub['problems_with_digit']} problems, of which `{summary['reference']}` solved and this "
                         f"method missed {sub['lost_with_digit']}; commonest: {common}")
    return ["", "Rule events:", "", *lines] if lines else []


def format_accuracy(a: dict) -> str:
    """Percent correct with its interval, as the tables print it."""
    return f"{100 * a['acc']:.1f} [{100 * a['ci95'][0]:.1f}, {100 * a['ci95'][1]:.1f}]"


def _speedup(m: dict) -> str:
    """A method's speedup cell: '-' where none of its rows ran on the reference's machine."""
    return f"{m['speedup']:.2f}x" if m["speedup_problems"] else "-"


def plot(summary: dict, run_dir: Path) -> list[Path]:
    """accuracy_vs_speedup.png (with intervals) and acceptance_by_position.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grader = summary["grader"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in summary["methods"].items():
        if not m["speedup_problems"]:  # no row timed on the reference's machine: no speedup to place it at
            continue
        a = m["accuracy"][grader]
        ax.errorbar(m["speedup"], 100 * a["acc"], yerr=[[100 * (a["acc"] - a["ci95"][0])],
                    [100 * (a["ci95"][1] - a["acc"])]], fmt="o", capsize=4, label=name)
    ax.set_xlabel(f"speedup vs {summary['reference']} ({'total' if summary.get('batched') else 'median'} "
                  "tokens/s ratio)")
    ax.set_ylabel(f"accuracy, {grader} (%)")
    ax.set_title(f"{summary['problems']} problems")
    ax.legend(fontsize=8)
    fig.tight_layout()
    first = run_dir / "accuracy_vs_speedup.png"
    fig.savefig(first, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, m in summary["methods"].items():
        if m["acceptance_by_position"]:
            ax.plot(range(1, len(m["acceptance_by_position"]) + 1), m["acceptance_by_position"], marker="o", label=name)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0, 1.05)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    second = run_dir / "acceptance_by_position.png"
    fig.savefig(second, dpi=120)
    plt.close(fig)
    return [first, second]


def report(run_dir: str | Path, reference: str = "vanilla", grader: str | None = None,
           paired: list[str] | None = None, only: list[str] | None = None, out: str | Path | None = None,
           margins: bool = False) -> str:
    """Write report.md, summary.json and the plots into ``out`` (default ``run_dir``, e.g. another folder for a
    report on a subset of the methods); returns the Markdown. ``margins``: first load the target and measure
    its top-2 logit margin where a lossless method's output differs from the reference's."""
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no run.json); run `semverify compare` first")
    summary = summarise(run_dir, reference, grader, paired, only)
    if margins:
        compute_margins(run_dir, summary)
    path = run_dir / MARGINS_FILE
    summary["margins"] = json.loads(path.read_text()) if path.exists() else {}
    text = markdown(summary)
    out = Path(out) if out is not None else run_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(summary, out)
    return text
