"""Law probe: does coupled sampling change the law of an acceptance rule's first output token?

Held out from the test suite and built on the public API only (``semverify.generate``, ``semverify.get_rule``,
``semverify.CoupledNoise``). A tiny random Qwen2 target (vocabulary 8, fp32, first-token distributions spread
over several tokens) and a draft that is a noisy copy of it decode each prompt on many rows with one draft
token a step (``num_assistant_tokens=1``). For every rule and prompt the first output token is drawn three ways:
coupled (one ``CoupledNoise`` per row), uncoupled (one ``torch.Generator`` per row) and an uncoupled control
on other seeds. The table gives TV(coupled, uncoupled), the control TV(uncoupled, uncoupled') as the Monte
Carlo noise scale, the chi-square two-sample p-value of coupled against uncoupled (of the control too), and
each law's TV to the target's own first-token distribution p* (zero up to noise for a lossless rule).
Verdict: ``ok`` when that p-value exceeds --alpha, else ``DIFFERS``.

Resolution: at 4000 rows the control TV is about 0.02-0.025, and a true TV of about 0.04 is detected. Run (about
a minute per rule at 4000 rows on two free cores, several when they are busy):

    .venv/bin/python scripts/law_probe.py --rows 4000
    .venv/bin/python scripts/law_probe.py --rows 500 --rules speculative,easd --json /tmp/law.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time

import numpy as np
import torch
from scipy.stats import chi2_contingency
from transformers import Qwen2Config, Qwen2ForCausalLM

import semverify

VOCAB = 8
PROMPTS = "1,2,3;4,5;0,7,6,5;3"
RULES: dict[str, dict] = {  # rule name -> parameters for semverify.get_rule
    "speculative": {},
    "typical": {},
    "easd": {"draft_entropy": 0.5, "target_entropy": 0.5, "top_n": 3, "overlap": 0.3},
    "threshold": {"threshold_single": 0.5, "threshold_acc": 0.5},
    "relaxed_topk": {"topk": 3, "delta": math.log(2), "space": "log"},
    "ensemble": {"weight": 0.7},
    "mars": {"theta": 0.9},
    "sense": {"theta_e": 0.05, "top_k": 2, "window": 0},
}


def tiny_pair(seed: int, draft_noise: float) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    """A tiny random target (init std 0.2, so its next-token laws are neither flat nor peaked) and a draft: its
    weights plus Gaussian noise of ``draft_noise`` times each tensor's std (0.2: TV(p, q) 0.15-0.4 here)."""
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.2, tie_word_embeddings=False,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    target = Qwen2ForCausalLM(config).eval()
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for weight in draft.parameters():
            weight.add_(torch.randn_like(weight) * draft_noise * weight.std().nan_to_num(0.0))
    return target, draft


def first_tokens(target, draft, rule: semverify.BaseRule, prompt: list[int], generators: list, chunk: int
                 ) -> np.ndarray:
    """Counts over the vocabulary of the first output token, one row per generator, in batches of ``chunk``."""
    counts = np.zeros(VOCAB, dtype=np.int64)
    for start in range(0, len(generators), chunk):
        part = generators[start:start + chunk]
        ids = torch.tensor([prompt] * len(part))
        with torch.no_grad():
            out = semverify.generate(target, ids, assistant_model=draft, num_assistant_tokens=1, max_new_tokens=2,
                                     do_sample=True, top_k=0, rule=rule, attention_mask=torch.ones_like(ids),
                                     generator=part)
        counts += np.bincount(out[:, len(prompt)].numpy(), minlength=VOCAB)
    return counts


def tv(a: np.ndarray, b: np.ndarray) -> float:
    """Total-variation distance between two count (or probability) vectors, each normalised."""
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def chi2_p(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of the chi-square two-sample test (homogeneity) of two count vectors, empty tokens dropped."""
    table = np.stack([a, b])[:, (a + b) > 0]
    return 1.0 if table.shape[1] < 2 else float(chi2_contingency(table, correction=False)[1])


def probe(target, draft, rule_name: str, prompt: list[int], base: int, rows: int, chunk: int) -> dict:
    """One table row: the first-token laws of one rule on one prompt, coupled, uncoupled and control."""
    rule = semverify.get_rule(rule_name, **RULES[rule_name])
    uncoupled, control = (first_tokens(target, draft, rule, prompt,
                                       [torch.Generator().manual_seed(base + offset + i) for i in range(rows)], chunk)
                          for offset in (0, rows))
    coupled = first_tokens(target, draft, rule, prompt,
                           [semverify.CoupledNoise(base + 2 * rows + i) for i in range(rows)], chunk)
    with torch.no_grad():
        exact = target(torch.tensor([prompt])).logits[0, -1].double().softmax(-1).numpy()
    return {"rule": rule_name, "prompt": prompt, "rows": rows,
            "tv_coupled_uncoupled": tv(coupled, uncoupled), "tv_control": tv(uncoupled, control),
            "p_coupled_uncoupled": chi2_p(coupled, uncoupled), "p_control": chi2_p(uncoupled, control),
            "tv_coupled_target": tv(coupled, exact), "tv_uncoupled_target": tv(uncoupled, exact),
            "coupled": coupled.tolist(), "uncoupled": uncoupled.tolist(), "control": control.tolist(),
            "target": exact.round(6).tolist()}


def print_table(results: list[dict], alpha: float) -> None:
    header = (f"{'rule':<13}{'prompt':<11}{'TV(c,u)':>8}{'TV(u,u)':>8}{'p(c,u)':>10}{'p(u,u)':>10}"
              f"{'TV(c,p*)':>9}{'TV(u,p*)':>9}  verdict")
    print(header)
    print("-" * len(header))
    for r in results:
        verdict = "ok" if r["p_coupled_uncoupled"] > alpha else "DIFFERS"
        print(f"{r['rule']:<13}{','.join(map(str, r['prompt'])):<11}{r['tv_coupled_uncoupled']:>8.3f}"
              f"{r['tv_control']:>8.3f}{r['p_coupled_uncoupled']:>10.2e}{r['p_control']:>10.2e}"
              f"{r['tv_coupled_target']:>9.3f}{r['tv_uncoupled_target']:>9.3f}  {verdict}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4000, help="rows (samples) per law (default 4000)")
    parser.add_argument("--chunk", type=int, default=1000, help="rows per generate() call (default 1000)")
    parser.add_argument("--prompts", default=PROMPTS, help=f"token-id prompts, ';' between them (default {PROMPTS})")
    parser.add_argument("--rules", default=",".join(RULES), help=f"comma-separated, of {', '.join(RULES)}")
    parser.add_argument("--seed", type=int, default=0, help="model seed and base of the sampling seeds")
    parser.add_argument("--draft-noise", type=float, default=0.2, help="the draft's weight noise, x each std")
    parser.add_argument("--alpha", type=float, default=1e-3, help="chi-square p-value below which a law differs")
    parser.add_argument("--json", metavar="OUT", help="also write the table (with the counts) as JSON to OUT")
    args = parser.parse_args(argv)
    args.prompts = [[int(t) for t in p.split(",")] for p in args.prompts.split(";") if p.strip()]
    args.rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    unknown = [r for r in args.rules if r not in RULES]
    if unknown:
        parser.error(f"unknown rules {', '.join(unknown)}; probed rules: {', '.join(RULES)}")
    if any(not 0 <= t < VOCAB for p in args.prompts for t in p) or not all(args.prompts):
        parser.error(f"prompts are non-empty lists of token ids in [0, {VOCAB})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target, draft = tiny_pair(args.seed, args.draft_noise)
    results = []
    for rule_name in args.rules:
        started = time.perf_counter()
        for j, prompt in enumerate(args.prompts):
            results.append(probe(target, draft, rule_name, prompt, args.seed * 10**7 + j * 3 * args.rows,
                                 args.rows, args.chunk))
        worst = max(r["tv_coupled_uncoupled"] for r in results[-len(args.prompts):])
        print(f"[law_probe] {rule_name}: {len(args.prompts)} prompts x {args.rows} rows x 3 laws in "
              f"{time.perf_counter() - started:.1f}s, max TV(coupled, uncoupled) {worst:.3f}", file=sys.stderr)
    print_table(results, args.alpha)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
