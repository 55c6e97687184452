"""Which tokens a lossy rule kept where the target would have chosen another: teacher forced on the rule's own
outputs, the rank of each kept token in the target's distribution there (1 = the target's most likely token), its
probability and the probability of the most likely token, by the reason the rule gave. A rule that mostly keeps
rank-1 tokens in place of sampled rarer ones decodes closer to greedy where the target is unsure. ``misplaced``
counts logged kept tokens whose text differs from the output's token at their position: 0 unless the log is off."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from .acceptance import ForcedRun
from .rows import read_rows


def ranks_of(p: torch.Tensor, tokens: torch.LongTensor) -> tuple[torch.LongTensor, torch.Tensor]:
    """Each token's rank in its row of ``p`` [n, V] (1 = most likely; a tie takes the better rank) and its
    probability."""
    chosen = p.gather(1, tokens[:, None])[:, 0]
    return (p > chosen[:, None]).sum(1) + 1, chosen


def kept_ranks(run_dir: str | Path, method: str, limit: int | None = None) -> dict:
    """Per reason: how many kept tokens sat at each rank of the target's (warped) distribution, their mean
    probability, and the mean probability of the target's most likely token at the same positions (the chance
    that sampling alone would have drawn it)."""
    rows = sorted((r for r in read_rows(run_dir) if r["method"] == method and r.get("substitutions")),
                  key=lambda r: (r["id"], r.get("sample", 0)))
    if not rows:
        raise ValueError(f"no row of {method!r} in {run_dir} logged a kept token the target would not have chosen")
    rows = rows[:limit] if limit else rows
    forced = ForcedRun(run_dir)
    s, tokenizer = forced.settings, forced.tokenizer
    reasons: dict[str, dict] = {}
    misplaced = 0
    for row in tqdm(rows, desc="kept tokens", unit="output"):
        ids, start = forced.inputs(row)
        at = torch.tensor([sub["at"] for sub in row["substitutions"]])
        with torch.inference_mode():
            logits = forced.target(input_ids=ids).logits[0]
            p = forced.sampler.probs(logits[start - 1 + at])  # the distribution each kept token was drawn against
        kept = torch.tensor(row["output_ids"])[at]
        ranks, p_kept = ranks_of(p, kept)
        for sub, token, rank, pk, top in zip(row["substitutions"], kept.tolist(), ranks.tolist(), p_kept.tolist(),
                                             p.max(1).values.tolist()):
            misplaced += tokenizer.decode([token]) != sub["kept"]  # the logged text and the output must agree
            r = reasons.setdefault(sub["reason"], {"kept": 0, "ranks": {}, "p_kept": 0.0, "p_top": 0.0})
            r["kept"] += 1
            key = str(rank) if rank < 4 else "4+"
            r["ranks"][key] = r["ranks"].get(key, 0) + 1
            r["p_kept"] += pk
            r["p_top"] += top
    for r in reasons.values():
        r["p_kept"] /= r["kept"]
        r["p_top"] /= r["kept"]
        r["rank_1_share"] = r["ranks"].get("1", 0) / r["kept"]
    result = {"run": str(run_dir), "method": method, "outputs": len(rows), "reasons": reasons, "misplaced": misplaced,
              "settings": {k: s[k] for k in ("target", "dtype", "temperature", "top_k", "top_p", "coupled") if k in s}}
    (forced.dir / f"kept-tokens-{method.replace(':', '_')}.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> None:
    """``python -m evals.kept_tokens RUN_DIR --method M [--limit N]``: writes RUN_DIR/kept-tokens-M.json."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m evals.kept_tokens", description=main.__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--method", required=True, help="the lossy method whose kept tokens to score")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N outputs that kept any")
    args = parser.parse_args(argv)
    print(json.dumps(kept_ranks(args.run_dir, args.method, args.limit), indent=2))


if __name__ == "__main__":
    main()
