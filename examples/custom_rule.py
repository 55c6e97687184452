"""A rule of your own, evaluated without editing semverify: this file is a plugin.

The contributing page's example rule (keep draft tokens while each is among the target's top 2) with a
method preset that uses it. ``--plugin`` imports the file before the methods are built, so the harness
compares it with the built-ins, and ``run.json`` records the file's sha256 (a resume after editing it is
refused unless ``--repin``):

    semverify compare --plugin examples/custom_rule.py --methods vanilla,sd,topk_match --limit 10 --out runs/topk

``SEMVERIFY_PLUGINS=examples/custom_rule.py`` does the same for every command, and a package of your own
declares it once as an entry point (``[project.entry-points."semverify.plugins"]``, see docs/contributing.md).
Run as a script, the file checks the rule on hand-built tensors: ``python examples/custom_rule.py``.
"""

from __future__ import annotations

import torch

from semverify import BaseRule, Draft, Method, Verdict, VerifyInput, register_method, register_rule
from semverify.rules import at_position, leading_true, prefix_mask, target_choices


class TopKMatch(BaseRule):
    """Keep draft tokens while each is among the target's top ``top_k`` (lossy; top_k=1 is greedy matching)."""

    name = "topk_match"

    def __init__(self, top_k: int = 2) -> None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.top_k = top_k

    def __call__(self, x: VerifyInput) -> Verdict:
        top = x.target_logits[:, : x.k].topk(self.top_k, dim=-1).indices     # [B, k, top_k]
        inside = (top == x.draft.tokens[..., None]).any(dim=-1)              # [B, k]
        n = leading_true(inside)                                             # kept prefix per row
        choice = target_choices(x)                                           # the target's own token, k+1 positions
        return Verdict(n, at_position(choice, n), {"topk": prefix_mask(n, x.k)}, target_tokens=choice[:, : x.k])


register_rule("topk_match", TopKMatch)
# the method `--methods topk_match` names: the draft model's chains, judged by the rule (topk_match:top_k=3 overrides)
register_method(Method("topk_match", "model", "topk_match", {"top_k": 2}))


if __name__ == "__main__":
    logits = torch.tensor([[[3.0, 2.0, 0.0], [0.0, 0.0, 5.0]]])   # [B=1, k+1=2, V=3]
    verdict = TopKMatch(top_k=2)(VerifyInput(Draft(torch.tensor([[1]])), logits, do_sample=False))
    assert verdict.n_accepted.tolist() == [1] and verdict.next_token.tolist() == [2]
    print("topk_match keeps the target's second choice; evaluate it with:\n  semverify compare --plugin "
          f"{__file__} --methods vanilla,sd,topk_match --limit 10 --out runs/topk")
