"""Speed benchmark: semverify's methods beside transformers' assisted generation and prompt lookup.

All methods run greedy in one process, on the same GSM8K prompts, in an order that alternates per
prompt; they are named as `evals.timing` names them (the registry's presets, ``hf_`` for transformers').
Speed is reported as medians of per-prompt ratios against transformers' target alone (``hf_vanilla``) in
the same run. Rows are written crash-safely to ``rows.jsonl`` as they finish, so a killed run resumes where
it stopped; rows and ``--methods`` with the names of earlier versions (``target``, ``semverify_sd``, ...)
are read as the registry's names, and a method given by such a name keeps it in the summary.

    semverify speed --limit 10 --max-new-tokens 128 --out results/speed
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from semverify.machine import machine

from .benchmarks import GSM8K
from .env import environment
from .rows import RowWriter, read_row_file
from .timing import Decoders, dtype_label, timed_method

METHODS = ("hf_vanilla", "hf_sd", "sd", "hf_sd_int8", "sd_int8", "hf_pld", "pld", "sd_tree", "sd_tree_int8",
           "sd_adaptive", "sd_adaptive_int8", "hybrid", "hybrid_int8")
BASELINE = "hf_vanilla"
# the names of earlier versions, in the rows of results/speed and results/speed-drafters
LEGACY = {"target": "hf_vanilla", "hf_assisted": "hf_sd", "hf_assisted_q8": "hf_sd_int8", "semverify_sd": "sd",
          "semverify_sd_q8": "sd_int8", "semverify_pld": "pld", "semverify_tree": "sd_tree",
          "semverify_tree_q8": "sd_tree_int8", "semverify_adaptive": "sd_adaptive",
          "semverify_adaptive_q8": "sd_adaptive_int8", "semverify_hybrid": "hybrid",
          "semverify_hybrid_q8": "hybrid_int8"}
_EARLIER = {new: old for old, new in LEGACY.items()}


STEP_COST_NOTE = ("\nStep cost: a step's draft, verification and other time in units of the target alone's time "
                  "per token; the speedup is about tau / (their sum).\n")


def summarise(rows: list[dict], methods: list[str]) -> dict:
    """Median tok/s, median per-prompt speed ratio vs the target alone, tau, alpha, identical outputs, per
    name in ``methods`` (names of earlier versions, in the rows too, read as the registry's)."""
    by = {(r["id"], LEGACY.get(r["method"], r["method"])): r for r in rows}
    names = {m: LEGACY.get(m, m) for m in methods}
    ids = sorted({r["id"] for r in rows if all((r["id"], n) in by for n in (BASELINE, *names.values()))})
    alone = [by[(i, BASELINE)] for i in ids]
    out = {}
    for m, n in names.items():
        rs = [by[(i, n)] for i in ids]
        stats = [r["stats"] for r in rs if r.get("stats")]
        out[m] = {
            "prompts": len(rs),
            "tok_s_median": statistics.median(r["tok_s"] for r in rs),
            "speedup_vs_target_median": statistics.median(r["tok_s"] / a["tok_s"] for r, a in zip(rs, alone)),
            "identical_to_target": sum(r["tokens"] == a["tokens"] for r, a in zip(rs, alone)),
            "tau": _mean([s["tau"] for s in stats]),
            "alpha": _mean([s["alpha"] for s in stats]),
            # the verification forward's width, and where the time went
            "draft_per_step": _mean([s["drafted"] / s["steps"] for s in stats]),
            "draft_lengths": _length_shares(stats),
            "time_shares": _shares(stats),
            "step_cost": _step_cost(stats, alone),
        }
    for ours, n in names.items():
        theirs = next((m for m, t in names.items() if t == transformers_counterpart(n)), None)
        if theirs is not None:
            out[ours][f"speedup_vs_{theirs}_median"] = statistics.median(
                by[(i, n)]["tok_s"] / by[(i, names[theirs])]["tok_s"] for i in ids)
    return out


def transformers_counterpart(method: str) -> str | None:
    """The transformers method a semverify method is compared with: prompt lookup with prompt lookup, the
    target alone with the target alone, every draft-model method with assisted generation on the same (plain
    or int8) draft; named by an earlier version's name when ``method`` is."""
    m = timed_method(LEGACY.get(method, method))
    if m.hf or m.method.decoder == "draft":
        return None
    theirs = ("hf_pld" if m.method.drafter == "prompt_lookup" else "hf_vanilla" if m.draft is None
              else "hf_sd_int8" if m.int8 else "hf_sd")
    return _EARLIER.get(theirs, theirs) if method in LEGACY else theirs


def _shares(stats: list[dict]) -> dict[str, float] | None:
    """Shares of the total time spent drafting, verifying and elsewhere (the loop's own work), pooled."""
    total = sum(s["total_time"] for s in stats)
    if not total:
        return None
    return {part: sum(s[f"{part}_time"] for s in stats) / total for part in ("draft", "verify", "other")}


def _step_cost(stats: list[dict], target_rows: list[dict]) -> dict[str, float] | None:
    """The arithmetic behind a speedup: a step's draft, verification and other time in units of the target
    alone's time per token (pooled over the same prompts); the speedup is about tau / their sum."""
    steps = sum(s["steps"] for s in stats)
    if not steps:
        return None
    per_token = sum(r["wall_s"] for r in target_rows) / sum(r["new_tokens"] for r in target_rows)
    return {part: sum(s[f"{part}_time"] for s in stats) / steps / per_token for part in ("draft", "verify", "other")}


def _length_shares(stats: list[dict]) -> dict[int, float] | None:
    """The share of steps that drafted each number of tokens (a planner's choices), pooled over prompts."""
    counts = Counter(n for s in stats for n in s.get("draft_lengths", []))
    total = sum(counts.values())
    return {n: c / total for n, c in sorted(counts.items())} if total else None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def markdown(summary: dict, env: dict) -> str:
    lines = [f"Speed, greedy, {dtype_label(env)}, {env['target']} <- {env['draft']}, {env['max_new_tokens']} new "
             f"tokens, {env['date'][:10]}, {env['cpu']} ({env['torch_threads']} threads)", "",
             "| method | prompts | tok/s (median) | speedup vs target (median) | vs transformers | tau | alpha "
             "| draft tokens per step | draft lengths (share of steps) | time draft/verify/other "
             "| step cost draft+verify+other | identical to target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, s in summary.items():
        vs = next((f"{v:.2f}x" for k, v in s.items() if k.startswith("speedup_vs_hf")), "")
        tau = f"{s['tau']:.2f}" if s["tau"] is not None else ""
        alpha = f"{s['alpha']:.2f}" if s["alpha"] is not None else ""
        width = f"{s['draft_per_step']:.1f}" if s.get("draft_per_step") is not None else ""
        shares = "/".join(f"{100 * v:.0f}%" for v in s["time_shares"].values()) if s.get("time_shares") else ""
        cost = "+".join(f"{v:.2f}" for v in s["step_cost"].values()) if s.get("step_cost") else ""
        common = sorted((s.get("draft_lengths") or {}).items(), key=lambda kv: -kv[1])[:3]  # the 3 commonest
        lengths = ", ".join(f"{n}: {100 * share:.0f}%" for n, share in common)
        lines.append(f"| {m} | {s['prompts']} | {s['tok_s_median']:.2f} | {s['speedup_vs_target_median']:.2f}x | "
                     f"{vs} | {tau} | {alpha} | {width} | {lengths} | {shares} | {cost} | "
                     f"{s['identical_to_target']}/{s['prompts']} |")
    return "\n".join(lines) + "\n" + STEP_COST_NOTE


def run_speed(args) -> str:
    """The whole benchmark for the parsed ``semverify speed`` arguments; returns the Markdown table."""
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    methods = [timed_method(LEGACY.get(n, n), args.k, args.pld_tokens) for n in names]
    if BASELINE not in [m.name for m in methods]:
        raise ValueError(f"--methods must include {BASELINE!r} (transformers' target alone, the baseline)")
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"--methods names a method twice: {', '.join(names)}")
    problems = GSM8K().load(args.data, args.limit)
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    rows_path = out_dir / "rows.jsonl"
    env = environment(target=args.target, draft=args.draft, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                      k=args.k, pld_tokens=args.pld_tokens, limit=args.limit, prompt="chat zero-shot, Final Answer",
                      device=args.device)
    with RowWriter(rows_path) as writer:  # locks the file and cuts a torn last line before the done-set is read
        done = {(r["id"], LEGACY.get(r["method"], r["method"])) for r in read_row_file(rows_path)}
        run = Decoders(args.target, args.draft, args.dtype, methods, args.device)
        env["dtypes"] = run.dtypes
        run.warm_up(methods, 8)
        todo = [(prob, m) for prob in problems for m in (methods if prob.id % 2 == 0 else methods[::-1])
                if (prob.id, m.name) not in done]
        for prob, m in tqdm(todo, desc="speed", unit="run"):
            ids = run.tokenizer(GSM8K().prompt(run.tokenizer, prob), return_tensors="pt").input_ids
            start = run.clock()
            new, stats = run.decode(m, ids, args.max_new_tokens)
            wall = run.clock() - start
            writer.write({"id": prob.id, "method": m.name, "new_tokens": new.shape[1], "wall_s": wall,
                          "tok_s": new.shape[1] / wall, "tokens": new[0].tolist(), "stats": stats,
                          "machine": machine(run.device)})

    summary = summarise(read_row_file(rows_path), names)
    (out_dir / "summary.json").write_text(json.dumps({"environment": env, "summary": summary}, indent=2))
    (out_dir / "summary.md").write_text(markdown(summary, env))
    return markdown(summary, env)
