"""Cost of one verification forward against the number of draft tokens it carries.

A tree drafter trades tokens per step (tau) against a wider verification forward. This measures the
target's forward time for n draft tokens after a cached GSM8K context, as a tree of n nodes under the
loop's own 4-D mask, relative to n = 0 (one token: plain decoding). Together with `semverify replay`
(tau and draft tokens per step of a drafter), ``tau / cost(draft tokens)`` predicts a speedup before
any timed run. Medians of interleaved repeats, saved with the environment.

    semverify forward-cost --out results/forward-cost
"""

from __future__ import annotations

import json
from pathlib import Path

from semverify import load_model
from semverify.cost import forward_seconds, save_costs
from semverify.machine import machine

from .benchmarks import GSM8K
from .env import environment

SIZES = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96)


def run_forward_cost(args) -> str:
    """Time the forwards for the parsed ``semverify forward-cost`` arguments; returns the Markdown table."""
    sizes = tuple(sorted({0, *(int(s) for s in args.sizes.split(","))}))
    model, tokenizer = load_model(args.target, dtype=args.dtype, device=args.device)
    problem = GSM8K().load("auto", 1)[0]
    text = GSM8K().prompt(tokenizer, problem) + problem.solution * 4  # a realistic context, long enough
    context = tokenizer(text, return_tensors="pt").input_ids[:, : args.context].to(model.device)
    seconds = forward_seconds(model, context, sizes, args.repeats)
    relative = {n: s / seconds[0] for n, s in seconds.items()}
    cached = save_costs(model, seconds, context.shape[1], args.repeats)  # what the draft planner reads
    env = environment(target=args.target, dtype=args.dtype, context=context.shape[1], repeats=args.repeats,
                      device=machine(model.device))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost.json").write_text(json.dumps({"seconds": seconds, "relative": relative, "environment": env},
                                              indent=2))
    lines = [f"Verification forward cost, {args.target}, {args.dtype}, {context.shape[1]} cached tokens, "
             f"{env['date'][:10]}, {env['cpu']} ({env['torch_threads']} threads), median of {args.repeats}", "",
             "| draft tokens | seconds | relative to one token |", "|---|---|---|"]
    lines += [f"| {n} | {seconds[n]:.3f} | {relative[n]:.2f} |" for n in sizes]
    (out / "cost.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines) + f"\n\nCached for the draft planner (sd_auto): {cached}"
