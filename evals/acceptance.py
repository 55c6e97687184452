"""What coupling costs in acceptance: on the same positions, the chance a draft token is kept under the
min(1, p/q) ratio test (1 - TV(p, q)) and under drafter-invariant matching with shared Gumbel noise
(the probability that both Gumbel-max draws agree), computed exactly from the two distributions."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from semverify.models import load_model
from semverify.sampling import Sampler

from .benchmarks import get_benchmark
from .rows import read_rows


def ratio_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[...]: speculative sampling's chance to keep a token drawn from q, sum_i min(p_i, q_i)."""
    return torch.minimum(p, q).sum(-1)


def coupled_acceptance(p: torch.Tensor, q: torch.Tensor, support: int = 64) -> torch.Tensor:
    """[...]: the chance that Gumbel-max draws from p and from q under the same noise agree,
    sum_i 1 / sum_j max(p_j / p_i, q_j / q_i) (Daliri, Musco and Suresh 2024). Token i's term is at most
    min(p_i, q_i), so summing over the ``support`` tokens of largest min(p_i, q_i) leaves out less than
    their remaining overlap mass; exact when V <= support."""
    flat_p, flat_q = p.reshape(-1, p.shape[-1]).double(), q.reshape(-1, q.shape[-1]).double()
    out = torch.zeros(flat_p.shape[0], dtype=torch.float64)
    for row, (pr, qr) in enumerate(zip(flat_p, flat_q)):
        overlap = torch.minimum(pr, qr)
        top = overlap.topk(min(support, pr.shape[0]))
        ids = top.indices[top.values > 0]
        if not len(ids):
            continue
        ratios = torch.maximum(pr[None, :] / pr[ids, None], qr[None, :] / qr[ids, None])  # [candidates, V]
        out[row] = (1.0 / ratios.sum(-1)).sum()
    return out.reshape(p.shape[:-1]).float()


def measure(run_dir: str | Path, method: str = "vanilla", limit: int | None = None) -> dict:
    """Per-token acceptance of both schemes at every position of ``method``'s outputs in a run (teacher
    forced: the target and the draft score each output once, warped as the run sampled)."""
    run_dir = Path(run_dir)
    s = json.loads((run_dir / "run.json").read_text())["settings"]
    bench = get_benchmark(s["benchmark"])
    problems = {p.id: p for p in bench.load(s["data"], None)}
    rows = sorted((r for r in read_rows(run_dir) if r["method"] == method), key=lambda r: (r["id"], r.get("sample", 0)))
    rows = rows[:limit] if limit else rows
    target, tokenizer = load_model(s["target"], dtype=s["dtype"])
    draft, _ = load_model(s["draft"], dtype=s["dtype"])
    sampler = Sampler(True, s["temperature"], top_k=s.get("top_k") or None, top_p=s.get("top_p") or None)
    ratio, coupled = [], []
    for row in tqdm(rows, desc="acceptance", unit="output"):
        prompt = tokenizer(bench.prompt(tokenizer, problems[row["id"]], s["template"])).input_ids
        ids = torch.tensor([prompt + row["output_ids"]])
        n = len(row["output_ids"])
        with torch.inference_mode():
            p = sampler.probs(target(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + n])
            q = sampler.probs(draft(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + n])
        ratio += ratio_acceptance(p, q).tolist()
        coupled += coupled_acceptance(p, q).tolist()
    result = {"run": str(run_dir), "method": method, "outputs": len(rows), "positions": len(ratio),
              "ratio_acceptance": sum(ratio) / len(ratio), "coupled_acceptance": sum(coupled) / len(coupled),
              "settings": {k: s[k] for k in ("target", "draft", "dtype", "temperature", "top_k", "top_p")}}
    (run_dir / "acceptance.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> None:
    """``python -m evals.acceptance RUN_DIR [--method vanilla] [--limit N]``: writes RUN_DIR/acceptance.json."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m evals.acceptance", description=main.__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--method", default="vanilla", help="whose outputs to score (default vanilla)")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N outputs")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.run_dir, args.method, args.limit), indent=2))


if __name__ == "__main__":
    main()
