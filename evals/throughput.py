"""Batch throughput: total new tokens per second at several batch sizes, the target alone (transformers'
batched ``generate``, ``hf_vanilla``, and semverify's loop, ``vanilla``) beside speculative decoding (``sd``,
``sd_int8``) and prompt lookup (``pld``), all in one run on the same GSM8K prompts, greedy; methods are named
as `evals.timing` names them. Rows are written crash-safely as they finish (resumable); rows and
``--methods`` with the names of earlier versions (``target_hf``, ``target``) are read as the registry's
names, and a method given by such a name keeps it in the summary.

On a machine whose matrix units make a batch of rows nearly as cheap as one row (GPUs; fp32 on
AVX2 CPUs), batching the target alone gains throughput until compute runs out, while speculative
decoding spends that same headroom verifying drafts: the batch size where the two cross is reported.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from semverify.machine import machine
from semverify.registry import drafter_kind
from semverify.types import eos_ids

from .benchmarks import GSM8K
from .env import environment
from .rows import RowWriter, read_row_file
from .runner import left_pad
from .timing import Decoders, dtype_label, timed_method

METHODS = ("hf_vanilla", "vanilla", "sd", "sd_int8", "pld")
BASELINE = "vanilla"  # semverify's loop alone: each method's ratio at a batch size is against it
LEGACY = {"target_hf": "hf_vanilla", "target": "vanilla"}  # the names of earlier versions (results/batch)
_ALONE = ("vanilla", "hf_vanilla")


def real_tokens(new: torch.LongTensor, eos: set[int]) -> int:
    """New tokens of a batch up to and including each row's first EOS (padding after it is not output)."""
    total = 0
    for row in new.tolist():
        total += next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
    return total


def run_throughput(args) -> str:
    """The benchmark for the parsed ``semverify throughput`` arguments; returns the Markdown table."""
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    methods = [timed_method(LEGACY.get(n, n), args.k) for n in names]
    single = [m.name for m in methods if m.hf and m.name != "hf_vanilla" or not drafter_kind(m.method.drafter).batches]
    if single:
        raise ValueError(f"--methods {', '.join(single)} decode one sequence at a time; choose from "
                         f"{', '.join(METHODS)} or another method preset that batches")
    if len({m.name for m in methods}) != len(methods):
        raise ValueError(f"--methods names a method twice: {', '.join(names)}")
    sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
    problems = GSM8K().load(args.data, args.prompts)
    if len(problems) % max(sizes):
        raise ValueError(f"--prompts ({len(problems)}) must be a multiple of the largest batch size {max(sizes)}")
    out = Path(args.out)
    rows_path = out / "rows.jsonl"
    with RowWriter(rows_path) as writer:  # locks the file and cuts a torn last line before the done-set is read
        done = {(LEGACY.get(r["method"], r["method"]), r["batch_size"], r["first"]) for r in read_row_file(rows_path)}
        run = Decoders(args.target, args.draft, args.dtype, methods, args.device)
        eos = set(eos_ids(run.target.generation_config.eos_token_id))
        prompts = [run.tokenizer(GSM8K().prompt(run.tokenizer, p)).input_ids for p in problems]
        run.warm_up(methods, 4)
        todo = [(b, first, m) for b in sizes for first in range(0, len(prompts), b)
                for m in (methods if (first // b) % 2 == 0 else methods[::-1]) if (m.name, b, first) not in done]
        for b, first, m in tqdm(todo, desc="throughput", unit="batch"):
            ids, mask = left_pad(prompts[first : first + b], run.pad)
            start = run.clock()
            new, _ = run.decode(m, ids, args.max_new_tokens, mask)
            wall = run.clock() - start
            writer.write({"method": m.name, "batch_size": b, "first": first, "tokens": real_tokens(new, eos),
                          "wall_s": wall, "machine": machine(run.device)})
    env = environment(target=args.target, draft=args.draft, dtype=args.dtype, max_new_tokens=args.max_new_tokens,
                      k=args.k, prompts=len(prompts), batch_sizes=sizes, device=args.device, dtypes=run.dtypes)
    summary = summarise(read_row_file(rows_path), names, sizes)
    (out / "summary.json").write_text(json.dumps({"environment": env, "summary": summary}, indent=2))
    text = markdown(summary, env)
    (out / "summary.md").write_text(text)
    plot(summary, out / "throughput.png", env)
    return text


def summarise(rows: list[dict], methods: list[str], sizes: list[int]) -> dict:
    """Per name in ``methods`` and batch size: total tokens/s over the prompts, its ratio to B=1 and to the
    target alone (semverify's loop) at that size, and the crossover: the smallest batch size at which the
    target alone is at least as fast as each speculative method (names of earlier versions, in the rows
    too, read as the registry's)."""
    names = {m: LEGACY.get(m, m) for m in methods}
    table: dict[str, dict[int, dict]] = {}
    for m, n in names.items():
        for b in sizes:
            mine = [r for r in rows if LEGACY.get(r["method"], r["method"]) == n and r["batch_size"] == b]
            tokens, wall = sum(r["tokens"] for r in mine), sum(r["wall_s"] for r in mine)
            table.setdefault(m, {})[b] = {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall if wall else 0.0,
                                          "batches": len(mine)}
    alone = next((table[m] for m, n in names.items() if n == BASELINE), {})
    for m in names:
        for b in sizes:
            entry = table[m][b]
            entry["vs_b1"] = entry["tok_s"] / table[m][sizes[0]]["tok_s"] if table[m][sizes[0]]["tok_s"] else 0.0
            entry["vs_target"] = entry["tok_s"] / alone[b]["tok_s"] if alone and alone[b]["tok_s"] else None
    crossover = {m: next((b for b in sizes if (table[m][b]["vs_target"] or 0) <= 1.0), None)
                 for m, n in names.items() if n not in _ALONE}
    return {"table": table, "crossover": crossover, "sizes": sizes}


def markdown(summary: dict, env: dict) -> str:
    sizes = summary["sizes"]
    lines = [f"Batch throughput, greedy, {dtype_label(env)}, {env['target']} <- {env['draft']}, "
             f"{env['max_new_tokens']} new tokens, {env['prompts']} GSM8K prompts, {env['date'][:10]}, {env['cpu']} "
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
    ax.set_title(f"{dtype_label(env)}, {env['cpu']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
