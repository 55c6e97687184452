"""``semverify report RUN_DIR``: the Markdown report of a run (tables, paired tests against a reference,
rule events), with its summary.json and plots (`evals.summary`, `evals.plots`)."""

from __future__ import annotations

import json
from pathlib import Path

from semverify.methods import Method

from .margins import MARGINS_FILE, compute_margins
from .paired import as_points, holm_adjusted, interval_points, problems_needed
from .plots import plot
from .summary import run_cpus, summarise

POSITIONS = 10  # draft positions listed in the rule-event lines (step drafts have up to 128)


def markdown(summary: dict) -> str:
    """The report table headed by the environment and decoding settings."""
    run, env = summary["run"], summary["run"].get("environment", {})
    s = run["settings"]
    decoding = (f"sampling T={s['temperature']} top_k={s['top_k']} top_p={s['top_p']}" if s["do_sample"]
                else "greedy")
    if s.get("coupled"):
        decoding += (", coupled (noise keyed by position)" if not s.get("coupled_context")
                     else f", coupled (noise keyed by the last {s['coupled_context']} tokens)")
        decoding += f", {s.get('coupled_noise') or 'legacy'} noise, coupling {s.get('coupling') or 1}"
    uses_draft = any(Method.from_record(m).needs & {"draft_model", "draft_model_int8"} for m in run["methods"])
    draft = f"draft `{s['draft']}`" if uses_draft else "no draft model"
    if s.get("datastore"):
        draft += f", datastore `{s['datastore']}`"
    speedup = (f"ratio of total tokens/s (batches of {s['batch_size']}: a problem's own time includes its batch's)"
               if summary.get("batched") else "median per-problem tokens/s ratio")
    untimed = "accuracy" in run and not summary.get("timed")
    timed_problems = (summary.get("timed") or {}).get("problems", summary["problems"])
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
        *_accuracy_mode(summary),
        *([f"- left out: problems {spans(summary['left_out'])} (`--leave-out`)"] if summary.get("left_out") else []),
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
                     f"{alpha} | {'-' if untimed else format(m['tok_s_median'], '.2f')} | {_speedup(m)} | "
                     f"{m['at_cap']} | {m['wall_s']:.0f} | "
                     + " | ".join(ps) + " |")
    partial = [(f"- speedup of `{name}` over {m['speedup_problems']} of {summary['problems']} problems: on the "
                f"others its row and `{summary['reference']}`'s ran on different machines") if m["speedup_problems"]
               else (f"- no speedup for `{name}` (nor a point in the plot): none of its rows ran on the machine of "
                     f"`{summary['reference']}`'s row for the same problem")
               for name, m in summary["methods"].items() if m["speedup_problems"] < timed_problems and not untimed]
    return "\n".join(lines + ([""] + partial if partial else []) + _throughput(summary) + _machine_time(summary)
                     + _cap_regraded(summary) + _by_machine(summary) + _time_per_step(summary)
                     + _identical(summary) + _lossless_differences(summary) + _differences(summary)
                     + _groups(summary) + _rule_events(summary)) + "\n"


def _accuracy_mode(summary: dict) -> list[str]:
    """For an accuracy-mode run: what its accuracy and its speeds are measured over, each with its n."""
    run = summary["run"]
    if "accuracy" not in run:
        return []
    s, timed = run["settings"], summary.get("timed")
    samples = s.get("samples") or 1
    speed = (f"speed over the {timed['problems']} problems of its timed pass (`timed/`, one at a time, "
             f"{timed['dtype']})" if timed else "no speed (untimed rows; `--timed N` adds a timed pass)")
    dtype = run["accuracy"].get("dtype", s["dtype"])
    return [f"- accuracy mode: accuracy over {summary['problems']} problems x {samples} sample(s) ({dtype}, "
            f"batches of {s.get('batch_size') or 1}: {run['accuracy']['why']}); {speed}"]


def _throughput(summary: dict) -> list[str]:
    """For an accuracy-mode run with a timed pass: problems per hour of each pass on the problems both decoded."""
    timed = summary.get("timed") or {}
    gains = timed.get("throughput")
    if not gains:
        return []
    run = summary["run"]
    size = run["settings"].get("batch_size") or 1
    dtype = run["accuracy"].get("dtype", run["settings"]["dtype"])
    lines = ["", f"Throughput on {_machines(run)}: problems per hour, accuracy mode ({dtype}, batches of {size}, "
             f"a row charged its share of its batch's time) against the timed pass ({timed['dtype']}, one at a time), "
             "on the problems both passes decoded for every method", "",
             "| method | problems | accuracy mode | one at a time | gain |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {g['problems']} | {g['accuracy_per_hour']:.1f} | {g['timed_per_hour']:.1f} | "
              f"{g['gain']:.1f}x |" for name, g in gains.items()]
    return lines


def _machine_time(summary: dict) -> list[str]:
    """For an accuracy-mode run: the hours each method's outputs took and what the rest of the run would cost."""
    times = summary.get("machine_time")
    if not times:
        return []
    run = summary["run"]
    s = run["settings"]
    goal = f"{s['limit']} x {s.get('samples') or 1}" if s.get("limit") else None

    def hours(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = ["", f"Machine time of the accuracy pass on {_machines(run)} (all rows of each method; a batch's wall time "
             "as measured, with whatever else ran beside it)" + (f"; to reach {goal} outputs at the same pace" if goal
                                                                 else ""), "",
             "| method | outputs | hours | outputs per hour |" + (" outputs left | hours left |" if goal else ""),
             "|---|---|---|---|" + ("---|---|" if goal else "")]
    for name, t in times.items():
        rate = "-" if t["per_hour"] is None else f"{t['per_hour']:.1f}"
        lines.append(f"| {name} | {t['outputs']} | {hours(t['hours'])} | {rate} |"
                     + (f" {t['left']} | {hours(t['hours_left'])} |" if goal else ""))
    left = [t["hours_left"] for t in times.values()]
    total = (f" {sum(t['left'] for t in times.values())} | "
             f"{hours(None if None in left else sum(left))} |") if goal else ""
    lines.append(f"| all | {sum(t['outputs'] for t in times.values())} | {sum(t['hours'] for t in times.values()):.2f} "
                 f"| - |{total}")
    return lines


def spans(ids: list[int]) -> str:
    """Problem ids as ranges: [7, 100, 101, 102] -> "7, 100-102" (``parse_spans`` reads them back)."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def parse_spans(text: str) -> frozenset[int]:
    """Problem ids from "7,100-102" (ranges inclusive)."""
    ids: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or hi and not hi.isdigit() or hi and int(hi) < int(lo):
            raise ValueError(f"not a problem id or range: {part!r} (e.g. 7,100-115)")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(ids)


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


def _machines(run: dict) -> str:
    cpus = run_cpus(run)
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
    tested = {name: m["paired"][ref] for name, m in summary["methods"].items()
              if "difference" in m["paired"].get(ref, {})}
    holm = holm_adjusted({name: p["p_value"] for name, p in tested.items()})
    lines = []
    for name, p in tested.items():
        d, v = p["difference"], p["divergence"]
        at = "-" if v["median_first_divergence"] is None else f"{v['median_first_divergence']:.0f}"
        lines.append(f"| {name} | {as_points(d['difference'], d['low'], d['high'])} | "
                     f"{interval_points(d['anytime_low'], d['anytime_high'])} | {d['discordant']} | "
                     f"{100 * d['detectable']:.1f} | {problems_needed(0.02, d['sd'])} | "
                     f"{v['identical']} of {v['outputs']} | {at} | {v['flips']} | {holm[name]:.3f} |")
    if not lines:
        return []
    return ["", f"Paired against `{ref}` on {summary['grader']} (points; 95% bootstrap interval over problems, samples "
            "nested; anytime = a 95% confidence sequence, valid however often the run was read as it grew (a run "
            "stopped because its interval looked good needs this one); detectable = the difference this run finds "
            "with 80% power at its spread; for 2 pt = problems a "
            "2-point difference would need at that spread; first divergence = "
            "median token position among outputs that differ; flips = differing outputs whose grade changed; "
            f"Holm p = McNemar's p adjusted for the {len(tested)} methods tested against `{ref}` here):", "",
            "| method | difference | anytime | discordant problems | detectable | for 2 pt | identical outputs | "
            "first divergence | flips | Holm p |", "|---|---|---|---|---|---|---|---|---|---|", *lines]


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


def report(run_dir: str | Path, reference: str = "vanilla", grader: str | None = None,
           paired: list[str] | None = None, only: list[str] | None = None, out: str | Path | None = None,
           margins: bool = False, leave_out: frozenset[int] = frozenset()) -> str:
    """Write report.md, summary.json and the plots into ``out`` (default ``run_dir``, e.g. another folder for a
    report on a subset of the methods); returns the Markdown. ``margins``: first load the target and measure
    its top-2 logit margin where a lossless method's output differs from the reference's; ``leave_out``: problem
    ids not counted."""
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no run.json); run `semverify compare` first")
    summary = summarise(run_dir, reference, grader, paired, only, leave_out)
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
