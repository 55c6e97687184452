"""Verification: a rule judges each row of a batch, each path of a tree, or a sampled tree sibling by sibling.

Kept apart from `semverify.engine.tree` (tree geometry: masks, positions, cache compaction) and from the
rules themselves, so that rules build on it and nothing here imports a rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..types import Draft, Judge, Verdict, VerifyInput
from .noise import is_coupled, joined, per_row, rows_of, sample_from, uniform
from .tree import leaf_paths


def verify_rows(rule: Judge, x: VerifyInput) -> tuple[list[list[int]], Verdict]:
    """Each row's judged path and one verdict for the batch, every row judged as it would be alone.

    Chain drafts go to the rule once per group of rows with the same draft length (a padded position is never
    judged) when the engine draws for the rule (it states its law: each row's draws come from its own stream) or
    the draws are keyed by position (greedy, or coupled noise); rows of another rule whose draws consume a random
    stream, and tree or step drafts (`Draft.rows`), go one row at a time, each on its own draft."""
    batch, draft = x.draft.tokens.shape[0], x.draft
    if batch == 1 and draft.lengths is None:  # one row as drafted (a chain, a tree or its own step)
        path, verdict = verify_one(rule, x)
        return [path], verdict
    noises = per_row(x.generator, batch)
    by_law = getattr(rule, "states_law", False)
    if draft.kind in ("chain", "chains") and (by_law or not x.do_sample or all(map(is_coupled, noises))):
        lengths = draft.row_lengths()
        groups = [[i for i in range(batch) if lengths[i] == n] for n in sorted(set(lengths))]
        parts = [(rows, rule(_rows_input(x, rows, lengths[rows[0]], noises))) for rows in groups]
        return [list(range(lengths[i])) for i in range(batch)], _merge(parts, batch, x.k, x.target_logits.device)
    paths, parts = [], []
    for row in range(batch):
        path, part = verify_one(rule, _row_input(x, row))
        paths.append(path)
        parts.append(([row], part))
    return paths, _merge(parts, batch, x.k, x.target_logits.device)


def _merge(parts: list[tuple[list[int], Verdict]], batch: int, k: int, device: torch.device) -> Verdict:
    """One batch verdict from the verdicts of groups of rows (each group's masks as wide as its drafts)."""
    n = torch.zeros(batch, dtype=torch.long, device=device)
    token = torch.zeros(batch, dtype=torch.long, device=device)
    reasons: dict[str, torch.Tensor] = {}
    scores: dict[str, torch.Tensor] = {}
    target_tokens = None
    for rows, part in parts:
        index = torch.tensor(rows, dtype=torch.long, device=device)
        n[index], token[index] = part.n_accepted, part.next_token
        for name, mask in part.reasons.items():
            full = reasons.setdefault(name, torch.zeros(batch, k, dtype=torch.bool, device=device))
            full[index, : mask.shape[1]] = mask
        for name, value in part.scores.items():
            scores.setdefault(name, torch.full((batch,), float("nan"), device=device))[index] = value.float()
        if part.target_tokens is not None:
            if target_tokens is None:
                target_tokens = torch.full((batch, k), -1, dtype=torch.long, device=device)
            target_tokens[index, : part.target_tokens.shape[1]] = part.target_tokens
    return Verdict(n, token, reasons, scores, target_tokens)

def verify_one(rule: Judge, x: VerifyInput) -> tuple[list[int], Verdict]:
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
    return VerifyInput(draft, x.target_logits[r, : length + 1], x.do_sample, hidden, rows_of(x.generator, [row]),
                       **_tails(x, r))


def _rows_input(x: VerifyInput, rows: list[int], length: int, noises: list) -> VerifyInput:
    """The rule's input for the chain-draft rows ``rows``, which all drafted ``length`` tokens; their draws go to
    their own streams (`CoupledRows` under coupled noise)."""
    batch = x.draft.tokens.shape[0]
    index = (slice(None) if rows == list(range(batch))  # every row: views, no copy of the logits
             else torch.tensor(rows, dtype=torch.long, device=x.draft.tokens.device))
    probs = x.draft.probs
    draft = Draft(x.draft.tokens[index, :length], None if probs is None else probs[index, :length])
    hidden = None if x.target_hidden is None else x.target_hidden[index, : length + 1]
    noise = joined([noises[i] for i in rows])  # `CoupledRows` under coupled noise
    return VerifyInput(draft, x.target_logits[index, : length + 1], x.do_sample, hidden, noise, **_tails(x, index))


def _tails(x: VerifyInput, rows: slice | torch.Tensor) -> dict:
    """The output tails of ``rows`` (a slice, or a [B] index): ``history`` [B, L] and ``output_lengths`` [B] of those
    rows, where the loop gave them."""
    return {name: None if value is None else value[rows]
            for name, value in (("history", x.history), ("output_lengths", x.output_lengths))}


@dataclass
class PathInput(VerifyInput):
    """One root-to-leaf path of a tree input: its target probabilities are rows of the parent's, so
    the softmax over the vocabulary runs once per tree (and only if a rule asks), not once per path."""

    parent: VerifyInput | None = None
    rows: list[int] | None = None

    @cached_property
    def target_probs(self) -> torch.FloatTensor:
        """[1, len(rows), V] the parent's probabilities at the root and the path's nodes."""
        return self.parent.target_probs[:, self.rows]


def verify_paths(rule: Judge, x: VerifyInput) -> tuple[list[int], Verdict]:
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
        verdict = rule(PathInput(chain, x.target_logits[:, rows], x.do_sample, hidden, x.generator,
                                 history=x.history, output_lengths=x.output_lengths, parent=x, rows=rows))
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
