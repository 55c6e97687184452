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
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from semverify import load_model
from semverify.cache import keep_first, new_cache
from semverify.tree import tree_attention_mask, tree_position_ids

from .benchmarks import GSM8K
from .env import environment

SIZES = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64, 96)


@torch.no_grad()
def forward_seconds(model, context: torch.LongTensor, sizes: tuple[int, ...], repeats: int,
                    progress: bool = True) -> dict[int, float]:
    """Median seconds of one forward over [root, n nodes] after a cache of ``context``, per n.

    The nodes form a bushy tree (each node's parent is a random earlier node, -1 for the root) so the
    mask is the loop's; repeats cycle through the sizes so drifts in machine speed hit all alike.
    """
    cache, past = new_cache(model), context.shape[1] - 1
    model(context[:, :-1], cache=cache, use_cache=True)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in tqdm(range(repeats + 1), desc="forward cost", disable=not progress):
        for n in sizes:
            parents = torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)], dtype=torch.long)
            tokens = torch.cat([context[:, -1:], torch.randint(0, vocab, (1, n), generator=gen)], dim=1)
            mask = tree_attention_mask(parents, past, 1, model.dtype)
            positions = tree_position_ids(parents, past, 1)
            start = time.perf_counter()
            model(tokens, cache=cache, attention_mask=mask, position_ids=positions, use_cache=True,
                  logits_to_keep=n + 1)
            times[n].append(time.perf_counter() - start)
            keep_first(cache, past)
    return {n: statistics.median(t[1:]) for n, t in times.items()}  # the first round warms up


def cost_at(costs: dict[int, float] | dict[str, float], n: float) -> float:
    """The relative cost of a forward with ``n`` draft tokens, linearly interpolated between sizes
    (held at the end values outside them)."""
    sizes = sorted(costs, key=int)
    return float(np.interp(n, [int(k) for k in sizes], [costs[k] for k in sizes]))


def run_forward_cost(args) -> str:
    """Time the forwards for the parsed ``semverify forward-cost`` arguments; returns the Markdown table."""
    sizes = tuple(sorted({0, *(int(s) for s in args.sizes.split(","))}))
    model, tokenizer = load_model(args.target, dtype=args.dtype)
    problem = GSM8K().load("auto", 1)[0]
    text = GSM8K().prompt(tokenizer, problem) + problem.solution * 4  # a realistic context, long enough
    context = tokenizer(text, return_tensors="pt").input_ids[:, : args.context]
    seconds = forward_seconds(model, context, sizes, args.repeats)
    relative = {n: s / seconds[0] for n, s in seconds.items()}
    env = environment(target=args.target, dtype=args.dtype, context=context.shape[1], repeats=args.repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost.json").write_text(json.dumps({"seconds": seconds, "relative": relative, "environment": env},
                                              indent=2))
    lines = [f"Verification forward cost, {args.target}, {args.dtype}, {context.shape[1]} cached tokens, "
             f"{env['date'][:10]}, {env['cpu']} ({env['torch_threads']} threads), median of {args.repeats}", "",
             "| draft tokens | seconds | relative to one token |", "|---|---|---|"]
    lines += [f"| {n} | {seconds[n]:.3f} | {relative[n]:.2f} |" for n in sizes]
    (out / "cost.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)
