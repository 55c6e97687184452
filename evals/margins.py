"""Where a lossless method's output differs from the reference's, the target's top-2 logit margin at the
first diverging token: a margin near zero is a numerical tie (rounding chose the other token), a wide one
is a bug. ``semverify report RUN --margins`` computes them with the run's target and saves them beside the
run, and every later report lists them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from semverify.models import load_model

from .benchmarks import Problem, get_benchmark
from .paired import divergence_position
from .rows import read_rows

MARGINS_FILE = "margins.json"


def lossless_differences(rows: list[dict], reference_rows: list[dict], ids: list[tuple[int, int]]) -> list[dict]:
    """The (problem, sample, first diverging position) of each output that differs from the reference's (the
    position is None for rows written before rows held token ids)."""
    out = []
    for (pid, sample), row, ref in zip(ids, rows, reference_rows):
        if row["output"] != ref["output"] or row.get("output_ids") != ref.get("output_ids"):
            out.append({"id": pid, "sample": sample, "position": divergence_position(row, ref)})
    return out


def top2_margin(model, prompt_ids: list[int], prefix: list[int]) -> float:
    """The target's top-1 minus top-2 logit after ``prompt_ids + prefix`` (one forward, its own dtype)."""
    ids = torch.tensor([prompt_ids + prefix])
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def compute_margins(run_dir: str | Path, summary: dict) -> dict:
    """Margins at every lossless difference the summary lists, keyed "method/problem/sample"; written to
    ``run_dir/margins.json`` (differences already there are not recomputed)."""
    run_dir = Path(run_dir)
    path = run_dir / MARGINS_FILE
    known = json.loads(path.read_text()) if path.exists() else {}
    s = summary["run"]["settings"]
    todo = [(name, d) for name, m in summary["methods"].items()
            for d in m["paired"].get(summary["reference"], {}).get("lossless_differences", [])
            if d["position"] is not None and f"{name}/{d['id']}/{d['sample']}" not in known]
    if not todo:
        return known
    bench = get_benchmark(s["benchmark"])
    problems = {p.id: p for p in bench.load(s["data"], None)}
    reference = {(r["id"], r.get("sample", 0)): r for r in read_rows(run_dir) if r["method"] == summary["reference"]}
    model, tokenizer = load_model(s["target"], dtype=s["dtype"])
    for name, d in tqdm(todo, desc="margins", unit="difference"):
        problem: Problem = problems[d["id"]]
        prompt = tokenizer(bench.prompt(tokenizer, problem, s["template"])).input_ids
        prefix = reference[(d["id"], d["sample"])]["output_ids"][: d["position"]]
        known[f"{name}/{d['id']}/{d['sample']}"] = top2_margin(model, prompt, prefix)
    path.write_text(json.dumps(known, indent=2))
    return known
