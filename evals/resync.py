"""Does coupled noise keyed by context, not position, keep a perturbed run paired with the target's?

Coupled sampling (`semverify.engine.coupling.CoupledNoise`) keys each Gumbel draw by output position, so a lossy rule
that changes one token early continues on another prefix with unrelated noise: its grade then differs from the
target's about as often as an independent sample's. This experiment keys the noise by context instead (the
last ``n`` tokens and how often that context occurred before in the output, so no key repeats within an output
and every draw stays exact) and measures, for both keyings, how often an EASD-like perturbation (at positions
whose warped target entropy is in the top ``rate``, the token is redrawn without the target's choice from a
second stream) changes the graded outcome against the unperturbed target on the same problems.

  python -m evals.resync --limit 32 --out results/coupling-resync
"""

from __future__ import annotations

import argparse
import json
import time
from difflib import SequenceMatcher
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import DynamicCache

from semverify.engine.coupling import RESAMPLE_STREAM, TARGET_STREAM, CoupledNoise
from semverify.models import load_model

from .benchmarks import get_benchmark
from .env import environment
from .grading import extract_flexible
from .runner import left_pad

ARMS = [("position", "base"), ("position", "perturbed"), ("context", "base"), ("context", "perturbed")]


@torch.inference_mode()
def decode(model, prompts: list[list[int]], seeds: list[int], scheme: str, threshold: float | None, args,
           eos: set[int], pad: int) -> list[dict]:
    """Sample every prompt's output with the given noise keying, perturbed where the entropy passes
    ``threshold`` (None: never); rows leave the batch at EOS."""
    ids, mask = left_pad(prompts, pad)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = DynamicCache()
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, logits_to_keep=1)
    rows = list(range(len(prompts)))
    noises = [CoupledNoise(seed, context=None if scheme == "position" else args.context, noise="legacy")
              for seed in seeds]  # the noise results/coupling-resync was measured with
    outputs, entropies, events = [[] for _ in prompts], [[] for _ in prompts], [0] * len(prompts)
    for step in tqdm(range(args.max_new_tokens), desc=f"{scheme}{'' if threshold is None else '+perturbed'}",
                     leave=False):
        logp = torch.log_softmax(out.logits[:, -1].float() / args.temperature, dim=-1)
        tokens = []
        for i, row in enumerate(rows):
            noise, vocab = noises[row].at(step, prompts[row] + outputs[row]), logp.shape[-1]
            token = int((logp[i] + noise.gumbel(0, vocab, TARGET_STREAM)).argmax())
            h = float(-(logp[i].exp() * logp[i]).nan_to_num().sum())
            entropies[row].append(h)
            if threshold is not None and h >= threshold:
                other = logp[i] + noise.gumbel(0, vocab, RESAMPLE_STREAM)
                other[token] = float("-inf")
                token, events[row] = int(other.argmax()), events[row] + 1
            tokens.append(token)
            outputs[row].append(token)
        going = [i for i, t in enumerate(tokens) if t not in eos and step + 1 < args.max_new_tokens]
        if not going:
            break
        if len(going) < len(rows):
            index = torch.tensor(going)
            cache.batch_select_indices(index)
            mask, positions = mask[index], positions[index]
            tokens, rows = [tokens[i] for i in going], [rows[i] for i in going]
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=-1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=torch.tensor(tokens)[:, None], attention_mask=mask, position_ids=positions,
                    cache=cache)
    return [{"output_ids": o, "entropies": e, "events": n} for o, e, n in zip(outputs, entropies, events)]


def summarize(rows: list[dict]) -> dict:
    """Per keying: accuracies, perturbation events, and how the perturbed outputs pair with the base ones."""
    by = {(r["scheme"], r["arm"], r["id"]): r for r in rows}
    summary = {}
    for scheme in ("position", "context"):
        ids = sorted(i for s, a, i in by if s == scheme and a == "perturbed" and (s, "base", i) in by)
        if not ids:
            continue
        pairs = [(by[(scheme, "base", i)], by[(scheme, "perturbed", i)]) for i in ids]
        shared = []
        for base, pert in pairs:
            a, b = base["output_ids"], pert["output_ids"]
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            tail_a, tail_b = a[first:], b[first:]
            if tail_a or tail_b:  # share of the tokens after the first divergence that the two outputs share
                match = SequenceMatcher(None, tail_a, tail_b, autojunk=False)
                shared.append(2 * sum(m.size for m in match.get_matching_blocks()) / (len(tail_a) + len(tail_b)))
        tokens = sum(len(p["output_ids"]) for _, p in pairs)
        summary[scheme] = {
            "problems": len(ids),
            "base correct": sum(b["correct"] for b, _ in pairs),
            "perturbed correct": sum(p["correct"] for _, p in pairs),
            "discordant": sum(b["correct"] != p["correct"] for b, p in pairs),
            "same answer": sum(b["answer"] == p["answer"] for b, p in pairs),
            "identical": sum(b["output_ids"] == p["output_ids"] for b, p in pairs),
            "events per 100 tokens": round(100 * sum(p["events"] for _, p in pairs) / max(tokens, 1), 2),
            "tokens shared after the first divergence (mean)": round(sum(shared) / max(len(shared), 1), 3),
        }
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=2, help="tokens of context in a noise key (default 2)")
    parser.add_argument("--rate", type=float, default=0.035,
                        help="share of the base run's positions whose entropy fires the perturbation")
    parser.add_argument("--out", default="results/coupling-resync")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bench = get_benchmark("gsm8k")
    problems = bench.load("auto", args.limit)
    model, tokenizer = load_model(args.target, dtype="float32")
    eos = set(model.generation_config.eos_token_id if isinstance(model.generation_config.eos_token_id, list)
              else [model.generation_config.eos_token_id])
    prompts = [tokenizer(bench.prompt(tokenizer, p)).input_ids for p in problems]
    seeds = [args.seed * 1_000_003 + p.id for p in problems]  # the seeds `compare` gives these problems
    rows_file = out / "rows.jsonl"
    rows = [json.loads(line) for line in rows_file.open()] if rows_file.exists() else []
    (out / "run.json").write_text(json.dumps({"settings": vars(args), "environment": environment()}, indent=2))
    threshold = None
    for scheme, arm in ARMS:
        if arm == "perturbed" and threshold is None:  # calibrated on the first base arm's entropies
            base = [h for r in rows if r["arm"] == "base" and r["scheme"] == "position" for h in r["entropies"]]
            threshold = float(torch.tensor(base).quantile(1 - args.rate))
        if any(r["scheme"] == scheme and r["arm"] == arm for r in rows):
            continue
        started = time.perf_counter()
        decoded = decode(model, prompts, seeds, scheme, threshold if arm == "perturbed" else None, args, eos,
                         tokenizer.pad_token_id or 0)
        wall = time.perf_counter() - started
        with rows_file.open("a") as f:
            for problem, d in zip(problems, decoded):
                text = tokenizer.decode(d["output_ids"], skip_special_tokens=True)
                capped = len(d["output_ids"]) >= args.max_new_tokens
                row = {"id": problem.id, "scheme": scheme, "arm": arm, "threshold": threshold, "wall": wall, **d,
                       "output": text, "answer": extract_flexible(text),
                       "correct": bench.grade_output(text, problem, capped)[bench.main_grader]}
                rows.append(row)
                f.write(json.dumps(row) + "\n")
        print(f"{scheme}/{arm}: {wall / 60:.1f} min", flush=True)
    summary = {"threshold (nats)": threshold, **summarize(rows)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
