"""Decode one GSM8K problem with several acceptance rules and print each answer with its statistics.

    python examples/rules_side_by_side.py                       # the default offline pair, greedy
    python examples/rules_side_by_side.py --do-sample --temperature 0.7 --problem 3

EASD needs entropy calibrations of both models and SemanticSpec a matched pair of probes (both shipped for
the default pair; for others run `semverify calibrate` / `semverify probes`); a rule whose files are
missing is skipped with a message. Rules are named by string: generate() tells them the models' names.
The step rules (semanticspec, step_likelihood, specreason) draft whole steps with the draft model.
"""

from __future__ import annotations

import argparse

import torch

import semverify
from evals.benchmarks import GSM8K
from evals.grading import grade


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=semverify.DEFAULT_TARGET)
    parser.add_argument("--draft", default=semverify.DEFAULT_DRAFT)
    parser.add_argument("--problem", type=int, default=0, help="index into the GSM8K dev problems")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--do-sample", action="store_true")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)

    target, tok = semverify.load_model(args.target, dtype=args.dtype)
    draft, _ = semverify.load_model(args.draft, dtype=args.dtype)
    gsm8k = GSM8K()
    problem = gsm8k.load(limit=args.problem + 1)[args.problem]
    ids = tok(gsm8k.prompt(tok, problem), return_tensors="pt").input_ids

    rules = ["target alone", "speculative", "typical", "easd", "semanticspec", "step_likelihood", "specreason"]
    print(f"Q: {problem.question}\n(gold answer {problem.answer})\n")
    for rule in rules:
        kwargs = {"drafter": semverify.NoDrafter()} if rule == "target alone" else {
            "assistant_model": draft, "rule": rule, "tokenizer": tok}
        if args.do_sample:
            kwargs.update(do_sample=True, temperature=args.temperature)
        try:
            out = semverify.generate(target, ids, max_new_tokens=args.max_new_tokens, return_dict_in_generate=True,
                                     generator=torch.Generator().manual_seed(0), **kwargs)
        except (FileNotFoundError, ValueError) as err:
            print(f"[skipping {rule}: {err}]\n")
            continue
        text = tok.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True)
        grades = grade(text, problem.answer)
        print(f"=== {rule}: math-verify {'correct' if grades['math_verify'] else 'wrong'}; "
              f"{out.spec_stats.summary()}; reasons {dict(out.spec_stats.reasons)}")
        print(text.strip()[-300:], "\n")


if __name__ == "__main__":
    main()
