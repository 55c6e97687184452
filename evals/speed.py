"""Speed benchmark: target alone, transformers' assisted generation and prompt lookup, and semverify's.

All methods run greedy in one process, on the same GSM8K prompts, in an order that alternates per
prompt. Speed is reported as medians of per-prompt ratios against the target alone in the same run.
Rows are appended to ``rows.jsonl`` as they finish, so a killed run resumes where it stopped.

    semverify speed --limit 10 --max-new-tokens 128 --out results/speed
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from semverify import HybridDrafter, ModelDrafter, ModelTreeDrafter, generate, load_model

from .benchmarks import GSM8K
from .env import environment, machine

METHODS = ("target", "hf_assisted", "semverify_sd", "hf_assisted_q8", "semverify_sd_q8", "hf_pld", "semverify_pld",
           "semverify_tree", "semverify_tree_q8", "semverify_adaptive", "semverify_adaptive_q8", "semverify_hybrid",
           "semverify_hybrid_q8")
# semverify's drafters besides plain SD (issue 21): draft-model trees, adaptive lengths, lookup first
DRAFTERS = {"semverify_tree": lambda draft: ModelTreeDrafter(draft, budget=24),
            "semverify_adaptive": lambda draft: ModelDrafter(draft, 0.4, adaptive=True, start=5),
            "semverify_hybrid": lambda draft: HybridDrafter(ModelDrafter(draft, 0.4))}


STEP_COST_NOTE = ("\nStep cost: a step's draft, verification and other time in units of the target alone's time "
                  "per token; the speedup is about tau / (their sum).\n")


def run_method(name: str, target, drafts: dict, ids: torch.LongTensor, args) -> tuple[torch.LongTensor, dict]:
    """Decode ``ids`` greedily with one method; returns the new tokens and the method's statistics.

    ``drafts`` holds the draft model as loaded (``"plain"``) and int8-quantized (``"q8"``); methods
    ending in ``_q8`` use the latter, for transformers and semverify alike.
    """
    common = dict(do_sample=False, max_new_tokens=args.max_new_tokens)
    draft = drafts["q8" if name.endswith("_q8") else "plain"]
    name = name.removesuffix("_q8")
    if name == "target":
        out, stats = target.generate(ids, **common), None
    elif name == "hf_assisted":
        out, stats = target.generate(ids, assistant_model=draft, **common), None
    elif name == "hf_pld":
        out, stats = target.generate(ids, prompt_lookup_num_tokens=args.pld_tokens, **common), None
    elif name == "semverify_sd":
        res = generate(target, ids, assistant_model=draft, num_assistant_tokens=args.k,
                       return_dict_in_generate=True, **common)
        out, stats = res.sequences, res.spec_stats.to_dict()
    elif name == "semverify_pld":
        res = generate(target, ids, prompt_lookup_num_tokens=args.pld_tokens, return_dict_in_generate=True, **common)
        out, stats = res.sequences, res.spec_stats.to_dict()
    elif name in DRAFTERS:
        k = 8 if name == "semverify_tree" else 2 * args.k if name == "semverify_adaptive" else args.k
        res = generate(target, ids, drafter=DRAFTERS[name](draft), num_assistant_tokens=k,
                       return_dict_in_generate=True, **common)
        out, stats = res.sequences, res.spec_stats.to_dict()
    else:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return out[0, ids.shape[1]:], stats


def summarise(rows: list[dict], methods: list[str]) -> dict:
    """Median tok/s, median per-prompt speed ratio vs the target alone, tau, alpha, identical outputs."""
    by = {(r["id"], r["method"]): r for r in rows}
    ids = sorted({r["id"] for r in rows if all((r["id"], m) in by for m in methods)})
    out = {}
    for m in methods:
        rs = [by[(i, m)] for i in ids]
        ratio = [by[(i, m)]["tok_s"] / by[(i, "target")]["tok_s"] for i in ids]
        out[m] = {
            "prompts": len(rs),
            "tok_s_median": statistics.median(r["tok_s"] for r in rs),
            "speedup_vs_target_median": statistics.median(ratio),
            "identical_to_target": sum(by[(i, m)]["tokens"] == by[(i, "target")]["tokens"] for i in ids),
            "tau": _mean([r["stats"]["tau"] for r in rs if r.get("stats")]),
            "alpha": _mean([r["stats"]["alpha"] for r in rs if r.get("stats")]),
            # the verification forward's width, and where the time went
            "draft_per_step": _mean([r["stats"]["drafted"] / r["stats"]["steps"] for r in rs if r.get("stats")]),
            "time_shares": _shares([r["stats"] for r in rs if r.get("stats")]),
            "step_cost": _step_cost([r["stats"] for r in rs if r.get("stats")], [by[(i, "target")] for i in ids]),
        }
    for ours in out:
        theirs = transformers_counterpart(ours)
        if theirs in out:
            out[ours][f"speedup_vs_{theirs}_median"] = statistics.median(
                by[(i, ours)]["tok_s"] / by[(i, theirs)]["tok_s"] for i in ids)
    return out


def transformers_counterpart(method: str) -> str | None:
    """The transformers method a semverify method is compared with: prompt lookup with prompt lookup,
    every draft-model method with assisted generation on the same (plain or int8) draft."""
    if not method.startswith("semverify_"):
        return None
    if method == "semverify_pld":
        return "hf_pld"
    return "hf_assisted_q8" if method.endswith("_q8") else "hf_assisted"


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


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def markdown(summary: dict, env: dict) -> str:
    lines = [f"Speed, greedy, {env['dtype']}, {env['target']} <- {env['draft']}, {env['max_new_tokens']} new tokens, "
             f"{env['date'][:10]}, {env['cpu']} ({env['torch_threads']} threads)", "",
             "| method | prompts | tok/s (median) | speedup vs target (median) | vs transformers | tau | alpha "
             "| draft tokens per step | time draft/verify/other | step cost draft+verify+other | identical to target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, s in summary.items():
        vs = next((f"{v:.2f}x" for k, v in s.items() if k.startswith("speedup_vs_hf")), "")
        tau = f"{s['tau']:.2f}" if s["tau"] is not None else ""
        alpha = f"{s['alpha']:.2f}" if s["alpha"] is not None else ""
        width = f"{s['draft_per_step']:.1f}" if s.get("draft_per_step") is not None else ""
        shares = "/".join(f"{100 * v:.0f}%" for v in s["time_shares"].values()) if s.get("time_shares") else ""
        cost = "+".join(f"{v:.2f}" for v in s["step_cost"].values()) if s.get("step_cost") else ""
        lines.append(f"| {m} | {s['prompts']} | {s['tok_s_median']:.2f} | {s['speedup_vs_target_median']:.2f}x | "
                     f"{vs} | {tau} | {alpha} | {width} | {shares} | {cost} | "
                     f"{s['identical_to_target']}/{s['prompts']} |")
    return "\n".join(lines) + "\n" + STEP_COST_NOTE


def run_speed(args) -> str:
    """The whole benchmark for the parsed ``semverify speed`` arguments; returns the Markdown table."""
    methods = args.methods.split(",")
    unknown = set(methods) - set(METHODS)
    if unknown or "target" not in methods:
        raise ValueError(f"--methods must include 'target' and only use {', '.join(METHODS)}")
    problems = GSM8K().load(args.data, args.limit)
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_path = out_dir / "rows.jsonl"
    done = {(r["id"], r["method"]) for r in map(json.loads, rows_path.open())} if rows_path.exists() else set()

    target, tokenizer = load_model(args.target, dtype=args.dtype)
    drafts = {"plain": load_model(args.draft, dtype=args.dtype)[0]}
    if any(m.endswith("_q8") for m in methods):
        drafts["q8"] = load_model(args.draft, quantize="int8")[0]
    env = environment(target=args.target, draft=args.draft, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                      k=args.k, pld_tokens=args.pld_tokens, limit=args.limit, prompt="chat zero-shot, Final Answer")
    warm = tokenizer("Warm up.", return_tensors="pt").input_ids
    for m in methods:  # first calls pay one-off allocation costs
        run_method(m, target, drafts, warm, argparse.Namespace(**{**vars(args), "max_new_tokens": 8}))

    todo = [(prob, m) for prob in problems for m in (methods if prob.id % 2 == 0 else methods[::-1])
            if (prob.id, m) not in done]
    with rows_path.open("a") as sink:
        for prob, m in tqdm(todo, desc="speed", unit="run"):
            ids = tokenizer(GSM8K().prompt(tokenizer, prob), return_tensors="pt").input_ids
            start = time.perf_counter()
            new, stats = run_method(m, target, drafts, ids, args)
            wall = time.perf_counter() - start
            row = {"id": prob.id, "method": m, "new_tokens": len(new), "wall_s": wall,
                   "tok_s": len(new) / wall, "tokens": new.tolist(), "stats": stats, "machine": machine()}
            sink.write(json.dumps(row) + "\n")
            sink.flush()

    rows = [json.loads(line) for line in rows_path.open()]
    summary = summarise(rows, methods)
    (out_dir / "summary.json").write_text(json.dumps({"environment": env, "summary": summary}, indent=2))
    (out_dir / "summary.md").write_text(markdown(summary, env))
    return markdown(summary, env)
