"""A rule of your own, evaluated without editing semverify: this file is a plugin.

The contributing page's example rule (keep draft tokens while each is among the target's top 2) with a
method preset that uses it. ``--plugin`` imports the file before the methods are built, so the harness
compares it with the built-ins, and ``run.json`` records the file's sha256 (a resume after editing it is
refused unless ``--repin``):

    semverify compare --plugin examples/custom_rule.py --methods vanilla,sd,topk_match --limit 10 --out runs/topk

``SEMVERIFY_PLUGINS=examples/custom_rule.py`` does the same for every command, and a package of your own
declares it once as an entry point (``[project.entry-points."semverify.plugins"]``, see docs/contributing.md).
Run as a script, the file checks the rule on hand-built tensors and its law in every mode (`check_rule_law`, as CI
does for the built-in rules): ``python examples/custom_rule.py``.
"""

from __future__ import annotations

import torch

from semverify import BaseRule, Draft, Method, TokenLaw, VerifyInput, register_method, register_rule
from semverify.testing import check_rule_law


class TopKMatch(BaseRule):
    """Keep draft tokens while each is among the target's top ``top_k`` (lossy; top_k=1 is greedy matching)."""

    name = "topk_match"

    def __init__(self, top_k: int = 2) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.top_k = top_k

    def law(self, x: VerifyInput) -> TokenLaw:
        p = x.target_probs[:, : x.k]                                           # [B, k, V] the target's law
        top = torch.zeros_like(p).scatter_(-1, p.topk(self.top_k, dim=-1).indices, 1.0)  # [B, k, V] 1 at its top-k
        if not x.do_sample:
            return TokenLaw(top, reason="topk")                    # keep the top-k; a refusal emits the argmax
        # sampling: the top-k surely, any other token as the target would draw it (p(x)); a refusal: p without x
        return TokenLaw(torch.maximum(top, p), target=0.0, without=1.0, reason="topk")


register_rule("topk_match", TopKMatch)
# the method `--methods topk_match` names: the draft model's chains, judged by the rule (topk_match:top_k=3 overrides)
register_method(Method("topk_match", "model", "topk_match", {"top_k": 2}))


if __name__ == "__main__":
    logits = torch.tensor([[[3.0, 2.0, 0.0], [0.0, 0.0, 5.0]]])   # [B=1, k+1=2, V=3]
    verdict = TopKMatch(top_k=2)(VerifyInput(Draft(torch.tensor([[1]])), logits, do_sample=False))
    assert verdict.n_accepted.tolist() == [1] and verdict.next_token.tolist() == [2]
    check_rule_law(TopKMatch(top_k=2)).raise_if_failed()  # uncoupled and coupled draws follow the stated law
    print("topk_match keeps the target's second choice; evaluate it with:\n  semverify compare --plugin "
          f"{__file__} --methods vanilla,sd,topk_match --limit 10 --out runs/topk")
