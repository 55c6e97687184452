"""Verification: a rule judges each row of a batch, each path of a tree, or a sampled tree sibling by sibling.

Kept apart from `semverify.tree` (tree geometry: masks, positions, cache compaction) and from the
rules themselves, so that rules build on it and nothing here imports a rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from .sampling import sample_from, uniform
from .tree import leaf_paths
from .types import Draft, Verdict, VerifyInput

if TYPE_CHECKING:
    from .rules import BaseRule


def verify_rows(rule: BaseRule, x: VerifyInput) -> tuple[list[list[int]], Verdict]:
    """Each row's judged path and one verdict for the batch. One row: its draft as it is. Several rows:
    each row's own draft on its own (`Draft.row`: a chain, a tree through the rule's `verify_tree`, a
    whole step), so that a row's verdict, and the random draws it takes from its own stream, are what
    they would be alone."""
    batch = x.draft.tokens.shape[0]
    if batch == 1 and x.draft.lengths is None:
        path, verdict = verify_one(rule, x)
        return [path], verdict
    k, device = x.k, x.target_logits.device
    n, token = torch.zeros(batch, dtype=torch.long, device=device), torch.zeros(batch, dtype=torch.long, device=device)
    reasons: dict[str, torch.Tensor] = {}
    scores: dict[str, torch.Tensor] = {}
    target_tokens = None
    paths = []
    for row in range(batch):
        path, part = verify_one(rule, _row_input(x, row))
        paths.append(path)
        n[row], token[row] = part.n_accepted[0], part.next_token[0]
        for name, mask in part.reasons.items():
            row_mask = reasons.setdefault(name, torch.zeros(batch, k, dtype=torch.bool, device=device))[row]
            row_mask[: mask.shape[1]] = mask[0]
        for name, value in part.scores.items():
            scores.setdefault(name, torch.full((batch,), float("nan"), device=device))[row] = float(value[0])
        if part.target_tokens is not None:
            if target_tokens is None:
                target_tokens = torch.full((batch, k), -1, dtype=torch.long, device=device)
            target_tokens[row, : part.target_tokens.shape[1]] = part.target_tokens[0]
    return paths, Verdict(n, token, reasons, scores, target_tokens)


def verify_one(rule: BaseRule, x: VerifyInput) -> tuple[list[int], Verdict]:
    """One row's judged path (node indices) and verdict: a tree through the rule's `verify_tree`."""
    if x.draft.is_tree:
        return rule.verify_tree(x)
    return list(range(x.k)), rule(x)


def _row_input(x: VerifyInput, row: int) -> VerifyInput:
    """The rule's input for one row of a batch: the row's own draft and the logits (and hidden states) of
    its root and its real draft positions."""
    draft = x.draft.row(row)
    length, r = draft.length, slice(row, row + 1)
    hidden = None if x.target_hidden is None else x.target_hidden[r, : length + 1]
    generator = x.generator[row] if isinstance(x.generator, (list, tuple)) else x.generator
    return VerifyInput(draft, x.target_logits[r, : length + 1], x.do_sample, hidden, generator)


@dataclass
class PathInput(VerifyInput):
    """One root-to-leaf path of a tree input: its target probabilities are rows of the parent's, so
    the softmax over the vocabulary runs once per tree (and only if a rule asks), not once per path."""

    parent: VerifyInput | None = None
    rows: list[int] | None = None

    @cached_property
    def target_probs(self) -> torch.FloatTensor:
        return self.parent.target_probs[:, self.rows]


def verify_paths(rule: BaseRule, x: VerifyInput) -> tuple[list[int], Verdict]:
    """Run ``rule`` on every root-to-leaf path of the draft in ``x`` and keep the longest acceptance.

    Exact for greedy decoding and coupled noise, where a path's verdict does not depend on the others.
    ``x.target_logits`` (and hidden states) hold the n+1 rows of ``[root, nodes...]``; a path's input takes
    the root row and its nodes' rows. A chain is the one-path case. Ties go to the first path. Returns the
    chosen path (node indices) and its verdict.
    """
    draft = x.draft
    if not draft.is_tree:
        return list(range(draft.length)), rule(x)
    best: tuple[list[int], Verdict] | None = None
    for path in leaf_paths(draft.parents):
        rows = [0] + [i + 1 for i in path]
        chain = Draft(tokens=draft.tokens[:, path], probs=None if draft.probs is None else draft.probs[:, path])
        hidden = None if x.target_hidden is None else x.target_hidden[:, rows]
        verdict = rule(PathInput(chain, x.target_logits[:, rows], x.do_sample, hidden, x.generator, parent=x,
                                 rows=rows))
        if best is None or int(verdict.n_accepted[0]) > int(best[1].n_accepted[0]):
            best = (path, verdict)
    assert best is not None, "a tree draft has at least one leaf"
    return best


def sample_tree(x: VerifyInput) -> tuple[list[int], Verdict]:
    """Lossless sampling over a tree of proposals chosen without the target's draws (one row).

    From the root down: the children of a node are tried in order, and a child with token t is kept with
    probability p'(t), where p' is the target's distribution at the node with the earlier siblings'
    tokens removed (renormalised). The first kept child is descended into; when none is kept, the next
    token is drawn from what is left of p'. Each test is speculative sampling with a one-hot proposal, so
    every emitted token is an exact draw from the target's distribution whatever the tree (EAGLE's
    multi-candidate rule). Returns a root-to-leaf path through the accepted nodes and the verdict.
    """
    draft, probs = x.draft, x.target_probs[0]  # rows [root, nodes...]
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(draft.parents.tolist()):
        children.setdefault(parent, []).append(node)
    tokens = draft.tokens[0].tolist()
    node, accepted = -1, []
    while True:
        left = probs[node + 1].clone()
        kept = None
        for child in children.get(node, []):
            total = left.sum()
            if total <= 0:
                break
            if float(uniform((1,), x.generator, left.device)[0] * total) < float(left[tokens[child]]):
                kept = child
                break
            left[tokens[child]] = 0.0
        if kept is None:
            break
        accepted.append(kept)
        node = kept
    if left.sum() <= 0:  # every token of p' was tried and refused: p itself had no mass elsewhere
        left = probs[node + 1]
    path = list(accepted)
    while children.get(path[-1] if path else -1):  # on to a leaf, for per-position counts
        path.append(children[path[-1] if path else -1][0])
    n = torch.tensor([len(accepted)], device=draft.tokens.device)
    next_token = sample_from(left[None], x.generator)
    return path, Verdict(n, next_token, {"ratio": torch.arange(len(path))[None, :] < len(accepted)})
