"""What coupling costs in acceptance: on the same positions, the chance a draft token is kept under the
min(1, p/q) ratio test (1 - TV(p, q)) and under drafter-invariant matching with shared Gumbel noise
(the probability that both Gumbel-max draws agree), computed exactly from the two distributions; and the
same for the lossy token rules in their paper's form and their coupled form (EASD, typical acceptance)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm import tqdm

from semverify.engine.sampling import Sampler
from semverify.methods import Method
from semverify.models import load_model
from semverify.registry import RunContext
from semverify.rules import TypicalAcceptance, entropy

from .benchmarks import get_benchmark
from .rows import read_rows


def ratio_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[...]: speculative sampling's chance to keep a token drawn from q, sum_i min(p_i, q_i)."""
    return torch.minimum(p, q).sum(-1)


def coupled_acceptance(p: torch.Tensor, q: torch.Tensor, support: int = 64,
                       only: torch.Tensor | None = None) -> torch.Tensor:
    """[...]: the chance that Gumbel-max draws from p and from q under the same noise agree,
    sum_i 1 / sum_j max(p_j / p_i, q_j / q_i) (Daliri, Musco and Suresh 2024). Token i's term is at most
    min(p_i, q_i), so summing over the ``support`` tokens of largest min(p_i, q_i) leaves out less than
    their remaining overlap mass; exact when V <= support. ``only`` [..., V] (bool): agree on one of these."""
    flat_p, flat_q = p.reshape(-1, p.shape[-1]).double(), q.reshape(-1, q.shape[-1]).double()
    flat_only = None if only is None else only.reshape(-1, only.shape[-1])
    out = torch.zeros(flat_p.shape[0], dtype=torch.float64)
    for row, (pr, qr) in enumerate(zip(flat_p, flat_q)):
        overlap = torch.minimum(pr, qr) if flat_only is None else torch.minimum(pr, qr) * flat_only[row]
        top = overlap.topk(min(support, pr.shape[0]))
        ids = top.indices[top.values > 0]
        if not len(ids):
            continue
        ratios = torch.maximum(pr[None, :] / pr[ids, None], qr[None, :] / qr[ids, None])  # [candidates, V]
        out[row] = (1.0 / ratios.sum(-1)).sum()
    return out.reshape(p.shape[:-1]).float()


def typical_acceptance(p: torch.Tensor, q: torch.Tensor, rule: TypicalAcceptance, coupled: bool) -> torch.Tensor:
    """[...]: the chance typical acceptance keeps a draft token x ~ q: p(x) above the rule's bound, or x
    the target's argmax (Medusa) or, coupled, x equal to the target's Gumbel-max token under the same noise."""
    bound = torch.clamp(rule.posterior_alpha * torch.exp(-entropy(p)), max=rule.posterior_threshold)
    typical = p > bound[..., None]
    by_bound = (q * typical).sum(-1)
    if coupled:
        return by_bound + coupled_acceptance(p, q, only=~typical)
    top = torch.zeros_like(typical).scatter_(-1, p.argmax(-1, keepdim=True), True)
    return by_bound + (q * (top & ~typical)).sum(-1)


def expected_tau(keep: list[float], k: int) -> float:
    """Tokens per verification of k-token drafts when each draft token is kept with the mean of ``keep``
    independently (the standard estimate, (1 - a^(k+1)) / (1 - a))."""
    a = min(sum(keep) / len(keep), 1 - 1e-9)
    return (1 - a ** (k + 1)) / (1 - a)


class ForcedRun:
    """A run's settings, problems, target and sampler, to score its outputs teacher forced as the run drew them."""

    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir)
        self.run = json.loads((self.dir / "run.json").read_text())
        s = self.settings = self.run["settings"]
        self.bench = get_benchmark(s["benchmark"])
        self.problems = {p.id: p for p in self.bench.load(s["data"], None)}
        self.target, self.tokenizer = load_model(s["target"], dtype=s["dtype"])
        self.sampler = Sampler(True, s["temperature"], top_k=s.get("top_k") or None, top_p=s.get("top_p") or None)

    def inputs(self, row: dict) -> tuple[torch.LongTensor, int]:
        """A row's prompt and output as one [1, n] sequence, and the prompt's length."""
        problem = self.problems[row["id"]]
        prompt = self.tokenizer(self.bench.prompt(self.tokenizer, problem, self.settings["template"])).input_ids
        return torch.tensor([prompt + row["output_ids"]]), len(prompt)


def measure(run_dir: str | Path, method: str = "vanilla", limit: int | None = None) -> dict:
    """Per-token acceptance of both schemes at every position of ``method``'s outputs in a run (teacher
    forced: the target and the draft score each output once, warped as the run sampled), for speculative
    sampling and for the run's EASD and typical methods, each with the tokens per verification it implies
    at its k beside the one its rows measured."""
    forced = ForcedRun(run_dir)
    run_dir, run, s, sampler = forced.dir, forced.run, forced.settings, forced.sampler
    all_rows = read_rows(run_dir)
    rows = sorted((r for r in all_rows if r["method"] == method), key=lambda r: (r["id"], r.get("sample", 0)))
    rows = rows[:limit] if limit else rows
    draft, _ = load_model(s["draft"], dtype=s["dtype"])
    context = RunContext.for_decoding(s["draft"], s["target"], True, s["temperature"], forced.tokenizer)
    lossy = {m.name: (m, m.build_rule(context)) for m in map(Method.from_record, run["methods"])
             if m.rule in ("easd", "typical") and m.drafter == "model"}
    keep = {name: {"ratio": [], "coupled": []} for name in ("speculative", *lossy)}
    for row in tqdm(rows, desc="acceptance", unit="output"):
        ids, start = forced.inputs(row)
        n = len(row["output_ids"])
        with torch.inference_mode():
            p = sampler.probs(forced.target(input_ids=ids).logits[0, start - 1 : start - 1 + n])
            q = sampler.probs(draft(input_ids=ids).logits[0, start - 1 : start - 1 + n])
        base = {"ratio": ratio_acceptance(p, q), "coupled": coupled_acceptance(p, q)}
        for scheme, kept in base.items():
            keep["speculative"][scheme] += kept.tolist()
            for name, (_, rule) in lossy.items():
                if isinstance(rule, TypicalAcceptance):
                    kept_here = typical_acceptance(p, q, rule, coupled=scheme == "coupled")
                else:  # EASD: the base test, and no token kept where both models are uncertain and agree
                    kept_here = kept * ~rule.uncertain_agreement(q, p)
                keep[name][scheme] += kept_here.tolist()
    ks = {"speculative": 5, **{name: m.k for name, (m, _) in lossy.items()}}
    rules = {}
    for name, schemes in keep.items():
        measured = [r["tau"] for r in all_rows if r["method"] == (name if name in lossy else "sd") and r.get("tau")]
        rules[name] = {"k": ks[name], **{f"{scheme}_acceptance": sum(v) / len(v) for scheme, v in schemes.items()},
                       **{f"{scheme}_tau": expected_tau(v, ks[name]) for scheme, v in schemes.items()},
                       "measured_tau": sum(measured) / len(measured) if measured else None,
                       "measured_outputs": len(measured)}
    result = {"run": str(run_dir), "method": method, "outputs": len(rows),
              "positions": len(keep["speculative"]["ratio"]),
              "ratio_acceptance": rules["speculative"]["ratio_acceptance"],
              "coupled_acceptance": rules["speculative"]["coupled_acceptance"], "rules": rules,
              "settings": {k: s[k] for k in ("target", "draft", "dtype", "temperature", "top_k", "top_p", "coupled")
                           if k in s}}
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
