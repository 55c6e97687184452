"""Replay recorded greedy outputs through model-free drafters: the tau that exact verification would
give each drafter, without running the target.

With exact greedy verification the output does not depend on the drafter, so any model-free drafter
(prompt lookup, lexical retrieval) can be scored on one recorded greedy output: at each step it
proposes from the true context, the longest draft path that agrees with the output is accepted, and
the target's own token follows. Hours of target decoding become seconds, which makes datastores and
drafter settings cheap to compare before a timed run. The figures are exact for the trajectory
replayed; a bf16 output is one valid greedy trajectory, and a timed run may drift from it at near-ties.
Rows record their token ids; older rows without them are re-tokenized from their text.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from semverify.cost import cost_at
from semverify.engine.tree import leaf_paths
from semverify.methods import Method
from semverify.models import load_tokenizer
from semverify.registry import DraftResources, make_drafter
from semverify.sense import Datastore

from .benchmarks import get_benchmark
from .rows import read_rows


@dataclass
class Replay:
    """One output replayed: target forwards (steps), tokens emitted, draft tokens accepted and proposed."""

    steps: int = 0
    tokens: int = 0
    accepted: int = 0
    drafted: int = 0

    @property
    def tau(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0


def agreeing_length(tokens: list[int], parents: list[int] | None, truth: list[int]) -> int:
    """Length of the longest root-to-leaf draft path whose tokens start ``truth`` (a chain if no parents)."""
    paths = leaf_paths(torch.tensor(parents)) if parents is not None else [list(range(len(tokens)))]
    best = 0
    for path in paths:
        n = 0
        while n < min(len(path), len(truth)) and tokens[path[n]] == truth[n]:
            n += 1
        best = max(best, n)
    return best


def replay(drafter, prompt_ids: list[int], output_ids: list[int], k: int) -> Replay:
    """Walk ``output_ids`` as exact verification of ``drafter``'s drafts would: accept the agreeing
    prefix of the best path, then the target's next token, until the output is spent."""
    drafter.reset(torch.tensor([prompt_ids]))
    result, t = Replay(), 0
    while t < len(output_ids):
        draft = drafter.propose(torch.tensor([prompt_ids + output_ids[:t]]), k, None, None)
        tokens = draft.tokens[0].tolist()
        parents = draft.parents.tolist() if draft.is_tree else None
        n = min(agreeing_length(tokens, parents, output_ids[t:]), len(output_ids) - t - 1)
        result.steps += 1
        result.drafted += len(tokens)
        result.accepted += n
        result.tokens += n + 1
        t += n + 1
        drafter.commit(n, torch.tensor([output_ids[t - 1]]))
    return result


def model_free_drafter(method: Method, datastore: Datastore | None, eos_token_id):
    """The drafter a model-free method decodes with; other methods cannot be replayed."""
    if not method.lossless():
        raise ValueError(f"method {method.name!r}: replay scores exact verification; rule {method.rule!r} "
                         "accepts by other criteria, so its output depends on the drafter")
    if "datastore" in method.drafter_params:
        datastore = Datastore.load(method.drafter_params["datastore"])
    try:
        drafter = make_drafter(method.drafter, DraftResources(datastore=datastore, eos_token_id=eos_token_id),
                               method.k, **method.drafter_settings)
    except ValueError as err:
        raise ValueError(f"method {method.name!r}: {err}; replay takes model-free drafters (pld, rest)") from None
    if drafter.needs_target_hidden:
        raise ValueError(f"method {method.name!r}: semantic retrieval needs the target's hidden states; replay "
                         "takes model-free drafters (pld, rest)")
    return drafter


def replay_run(run_dir: str | Path, methods: list[Method], datastore: Datastore | None = None,
               source: str = "vanilla", progress: bool = True) -> dict[str, dict]:
    """Replay ``source``'s outputs in a greedy compare run through each method's drafter.

    Returns per method: problems, mean tau over all tokens, median per-problem tau, draft tokens
    proposed per step (the size of the verification forward) and the acceptance rate of draft tokens.
    """
    run_dir = Path(run_dir)
    spec_path = run_dir / "run.json"
    if not spec_path.is_file():
        raise FileNotFoundError(f"no run.json in {run_dir}: replay reads a `semverify compare` run folder")
    settings = json.loads(spec_path.read_text())["settings"]
    if settings["do_sample"]:
        raise ValueError(f"{run_dir} is a sampled run; replay needs greedy outputs, which exact verification "
                         "reproduces whatever the drafter")
    rows = sorted((r for r in read_rows(run_dir) if r["method"] == source), key=lambda r: r["id"])
    if not rows:
        raise ValueError(f"no rows of method {source!r} in {run_dir}")
    tokenizer = load_tokenizer(settings["target"])
    bench = get_benchmark(settings["benchmark"])
    problems = {p.id: p for p in bench.load(settings["data"], settings["limit"], offset=settings.get("offset") or 0)}
    pairs = [(tokenizer(bench.prompt(tokenizer, problems[r["id"]], settings["template"])).input_ids,
              r.get("output_ids") or tokenizer(r["output"], add_special_tokens=False).input_ids) for r in rows]
    drafters = [model_free_drafter(m, datastore, tokenizer.eos_token_id) for m in methods]
    results = {}
    for method, drafter in zip(methods, drafters):
        runs = [replay(drafter, prompt, output, method.k)
                for prompt, output in tqdm(pairs, desc=f"replay {method.name}", disable=not progress)]
        steps, tokens = sum(r.steps for r in runs), sum(r.tokens for r in runs)
        results[method.name] = {
            "problems": len(runs), "tau": tokens / steps, "median_tau": statistics.median(r.tau for r in runs),
            "draft_per_step": sum(r.drafted for r in runs) / steps,
            "alpha": sum(r.accepted for r in runs) / max(1, sum(r.drafted for r in runs)),
        }
    return results


def add_predicted_speedup(results: dict[str, dict], cost_file: str | Path) -> None:
    """Add ``predicted_speedup`` = tau / the relative cost of a forward with that many draft tokens
    (from ``python -m evals.forward_cost``); drafting time and loop overhead are left out."""
    path = Path(cost_file)
    if not path.is_file():
        raise FileNotFoundError(f"cost file not found: {path} (make one with `python -m evals.forward_cost`)")
    relative = json.loads(path.read_text())["relative"]
    for r in results.values():
        r["forward_cost"] = cost_at(relative, r["draft_per_step"])
        r["predicted_speedup"] = r["tau"] / r["forward_cost"]


def replay_table(results: dict[str, dict]) -> str:
    """The replay results as a markdown table (with the predicted speedup when costs were added)."""
    costed = all("predicted_speedup" in r for r in results.values())
    head = "| method | problems | tau | median tau | draft tokens per step | alpha |"
    lines = [head + (" forward cost | tau / cost |" if costed else ""), "|---" * (8 if costed else 6) + "|"]
    for name, r in results.items():
        line = (f"| {name} | {r['problems']} | {r['tau']:.2f} | {r['median_tau']:.2f} | "
                f"{r['draft_per_step']:.1f} | {r['alpha']:.2f} |")
        lines.append(line + (f" {r['forward_cost']:.2f} | {r['predicted_speedup']:.2f}x |" if costed else ""))
    return "\n".join(lines)
