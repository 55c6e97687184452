"""Batch throughput: total new tokens per second at several batch sizes, the target alone (transformers'
batched ``generate`` and semverify's loop) beside speculative decoding (bf16 and int8 draft) and prompt
lookup, all in one run on the same GSM8K prompts, greedy. Rows are appended as they finish (resumable).

On a machine whose matrix units make a batch of rows nearly as cheap as one row (GPUs; fp32 on
AVX2 CPUs), batching the target alone gains throughput until compute runs out, while speculative
decoding spends that same headroom verifying drafts: the batch size where the two cross is reported.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from semverify import generate, load_model
from semverify.types import eos_ids

from .benchmarks import GSM8K
from .env import environment, machine

METHODS = ("target_hf", "target", "sd", "sd_int8", "pld")


def decode(method: str, target, drafts: dict, ids: torch.LongTensor, mask: torch.LongTensor, max_new_tokens: int,
           k: int, pad: int) -> torch.LongTensor:
    """The new tokens of one left-padded batch, greedy, with ``method``."""
    common = dict(attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    if method == "target_hf":
        return target.generate(ids, **common)[:, ids.shape[1]:]
    extra = {"target": {}, "sd": {"assistant_model": drafts.get("plain")},
             "sd_int8": {"assistant_model": drafts.get("int8")}, "pld": {"prompt_lookup_num_tokens": 10}}[method]
    return generate(target, ids, num_assistant_tokens=k, **common, **extra)[:, ids.shape[1]:]


def real_tokens(new: torch.LongTensor, eos: set[int]) -> int:
    """New tokens of a batch up to and including each row's first EOS (padding after it is not output)."""
    total = 0
    for row in new.tolist():
        total += next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
    return total


def run_throughput(args) -> str:
    """The benchmark for the parsed ``semverify throughput`` arguments; returns the Markdown table."""
    methods, sizes = args.methods.split(","), sorted({int(b) for b in args.batch_sizes.split(",")})
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown --methods {', '.join(sorted(unknown))}; choose from {', '.join(METHODS)}")
    problems = GSM8K().load(args.data, args.prompts)
    if len(problems) % max(sizes):
        raise ValueError(f"--prompts ({len(problems)}) must be a multiple of the largest batch size {max(sizes)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    done = {(r["method"], r["batch_size"], r["first"]) for r in map(json.loads, rows_path.open())} \
        if rows_path.exists() else set()
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    drafts = {}
    if "sd" in methods:
        drafts["plain"] = load_model(args.draft, dtype=args.dtype)[0]
    if "sd_int8" in methods:
        drafts["int8"] = load_model(args.draft, quantize="int8")[0]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = set(eos_ids(target.generation_config.eos_token_id))
    prompts = [tokenizer(GSM8K().prompt(tokenizer, p)).input_ids for p in problems]
    warm = tokenizer(["Warm up."], return_tensors="pt")
    for m in methods:  # first calls pay one-off allocation costs
        decode(m, target, drafts, warm.input_ids, warm.attention_mask, 4, args.k, pad)
    todo = [(b, first, m) for b in sizes for first in range(0, len(prompts), b)
            for m in (methods if (first // b) % 2 == 0 else methods[::-1]) if (m, b, first) not in done]
    with rows_path.open("a") as sink:
        for b, first, m in tqdm(todo, desc="throughput", unit="batch"):
            chunk = prompts[first : first + b]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            start = time.perf_counter()
            new = decode(m, target, drafts, ids, mask, args.max_new_tokens, args.k, pad)
            wall = time.perf_counter() - start
            sink.write(json.dumps({"method": m, "batch_size": b, "first": first, "tokens": real_tokens(new, eos),
                                   "wall_s": wall, "machine": machine()}) + "\n")
            sink.flush()
    rows = [json.loads(line) for line in rows_path.open()]
    env = environment(target=args.target, draft=args.draft, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                      k=args.k, prompts=len(prompts), batch_sizes=sizes)
    summary = summarise(rows, methods, sizes)
    (out / "summary.json").write_text(json.dumps({"environment": env, "summary": summary}, indent=2))
    text = markdown(summary, env)
    (out / "summary.md").write_text(text)
    plot(summary, out / "throughput.png", env)
    return text


def summarise(rows: list[dict], methods: list[str], sizes: list[int]) -> dict:
    """Per method and batch size: total tokens/s over the prompts, its ratio to B=1 and to the target
    alone (semverify's loop) at that size, and the crossover: the smallest batch size at which the
    target alone is at least as fast as each speculative method."""
    table: dict[str, dict[int, dict]] = {}
    for m in methods:
        for b in sizes:
            mine = [r for r in rows if r["method"] == m and r["batch_size"] == b]
            tokens, wall = sum(r["tokens"] for r in mine), sum(r["wall_s"] for r in mine)
            table.setdefault(m, {})[b] = {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall if wall else 0.0,
                                          "batches": len(mine)}
    for m in methods:
        for b in sizes:
            entry = table[m][b]
            entry["vs_b1"] = entry["tok_s"] / table[m][sizes[0]]["tok_s"] if table[m][sizes[0]]["tok_s"] else 0.0
            alone = table.get("target", {}).get(b, {}).get("tok_s")
            entry["vs_target"] = entry["tok_s"] / alone if alone else None
    crossover = {m: next((b for b in sizes if (table[m][b]["vs_target"] or 0) <= 1.0), None)
                 for m in methods if m not in ("target", "target_hf")}
    return {"table": table, "crossover": crossover, "sizes": sizes}


def markdown(summary: dict, env: dict) -> str:
    sizes = summary["sizes"]
    lines = [f"Batch throughput, greedy, {env['dtype']}, {env['target']} <- {env['draft']}, {env['max_new_tokens']} "
             f"new tokens, {env['prompts']} GSM8K prompts, {env['date'][:10]}, {env['cpu']} "
             f"({env['torch_threads']} threads)", "",
             "| method | " + " | ".join(f"B={b} tok/s (vs B=1, vs target)" for b in sizes) + " |",
             "|---" * (len(sizes) + 1) + "|"]
    for m, by_size in summary["table"].items():
        cells = []
        for b in sizes:
            e = by_size[b]
            vs = f", {e['vs_target']:.2f}x" if e["vs_target"] is not None else ""
            cells.append(f"{e['tok_s']:.2f} ({e['vs_b1']:.2f}x{vs})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines.append("")
    for m, b in summary["crossover"].items():
        lines.append(f"- `{m}`: " + (f"the target alone is as fast from batch size {b} on" if b is not None
                                      else f"faster than the target alone at every batch size up to {sizes[-1]}"))
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path, env: dict) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m, by_size in summary["table"].items():
        ax.plot(summary["sizes"], [by_size[b]["tok_s"] for b in summary["sizes"]], marker="o", label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("total new tokens/s")
    ax.set_title(f"{env['dtype']}, {env['cpu']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
