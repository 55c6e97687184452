"""Token trees: one target forward over many draft branches, path-wise verification, KV compaction.

A tree draft is a flat list of n tokens with ``parents[i] < i`` (-1: a child of the last accepted
token, the "root"). The target sees ``[root, t_0, ..., t_{n-1}]`` with a 4-D attention mask in which
each node attends to the cache, the root and its own ancestors, and with depth-based positions, so
every branch is scored exactly as if it had been verified alone (SpecInfer, REST, EAGLE).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .cache import UnsupportedCacheError
from .coupling import is_coupled
from .rules import AcceptanceRule
from .sampling import sample_from, uniform
from .types import Draft, Verdict, VerifyInput


def depths(parents: torch.LongTensor) -> torch.LongTensor:
    """Depth of every node; children of the root have depth 1."""
    out = torch.zeros(len(parents), dtype=torch.long)
    for i, p in enumerate(parents.tolist()):
        out[i] = 1 if p < 0 else out[p] + 1
    return out


def ancestor_mask(parents: torch.LongTensor) -> torch.BoolTensor:
    """[n, n] mask: entry (i, j) is True when node j is node i or one of its ancestors."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def leaf_paths(parents: torch.LongTensor) -> list[list[int]]:
    """Root-to-leaf node lists, in the order of their leaves."""
    plist = parents.tolist()
    has_child = {p for p in plist if p >= 0}
    paths = []
    for leaf in (i for i in range(len(plist)) if i not in has_child):
        path = [leaf]
        while plist[path[-1]] >= 0:
            path.append(plist[path[-1]])
        paths.append(path[::-1])
    return paths


def tree_attention_mask(parents: torch.LongTensor, past: int, pending: int, dtype: torch.dtype,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, 1, pending+n, past+pending+n] additive mask (0 attends, dtype min blocks).

    The input is ``pending`` uncached context tokens (the last of them is the root), then the n nodes:
    context tokens are causal, each node sees the cache, all context tokens and its own ancestors.
    """
    n, ctx = len(parents), past + pending
    allowed = torch.zeros(pending + n, ctx + n, dtype=torch.bool)
    allowed[:pending, :ctx] = torch.ones(pending, ctx, dtype=torch.bool).tril(diagonal=past)
    allowed[pending:, :ctx] = True
    allowed[pending:, ctx:] = ancestor_mask(parents)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def tree_position_ids(parents: torch.LongTensor, past: int, pending: int,
                      device: torch.device | str = "cpu") -> torch.LongTensor:
    """[1, pending+n] positions: context tokens in order, a node at the root's position + its depth."""
    ctx = torch.arange(past, past + pending)
    return torch.cat([ctx, past + pending - 1 + depths(parents)])[None].to(device)


@dataclass
class PathInput(VerifyInput):
    """One root-to-leaf path of a tree input: its target probabilities are rows of the parent's, so
    the softmax over the vocabulary runs once per tree (and only if a rule asks), not once per path."""

    parent: VerifyInput | None = None
    rows: list[int] | None = None

    @cached_property
    def target_probs(self) -> torch.FloatTensor:
        return self.parent.target_probs[:, self.rows]


def verify_paths(rule: AcceptanceRule, x: VerifyInput) -> tuple[list[int], Verdict]:
    """Run ``rule`` on every root-to-leaf path of the draft in ``x`` and keep the longest acceptance.

    A chain is the one-path case and is judged as it is. A sampled tree goes to the rule's
    ``verify_tree`` (speculative sampling: :func:`sample_tree`): path by path is exact for greedy only.
    For a greedy tree, ``x.target_logits`` (and hidden states) hold the n+1 rows of ``[root, nodes...]``;
    a path's input takes the root row and its nodes' rows. Ties go to the first path. Returns the chosen
    path (node indices) and its verdict.
    """
    draft = x.draft
    if not draft.is_tree:
        return list(range(draft.length)), rule(x)
    if x.do_sample and not is_coupled(x.generator):  # coupled noise is matched path by path, as greedy is
        return rule.verify_tree(x)
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


def require_full_attention(cache: DynamicCache) -> None:
    """Refuse caches whose layers a tree mask would get wrong or that cannot be reordered (sliding
    windows: a custom 4-D mask replaces the window; quantized or recurrent layers)."""
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise UnsupportedCacheError(f"tree drafts need full-attention cache layers; got {type(layer).__name__}")


def keep_path(cache: DynamicCache, start: int, nodes: list[int]) -> None:
    """Move the cache entries of tree ``nodes`` (stored at start + node) to start, start+1, ...

    The caller then crops the cache; entries of rejected branches are overwritten or cut off.
    """
    if nodes == list(range(len(nodes))):  # a chain's accepted prefix is already in place
        return
    require_full_attention(cache)
    src = torch.tensor(nodes) + start
    dst = torch.arange(len(nodes)) + start
    for layer in cache.layers:
        layer.keys[:, :, dst] = layer.keys[:, :, src.to(layer.keys.device)]
        layer.values[:, :, dst] = layer.values[:, :, src.to(layer.values.device)]


def merge_sequences(sequences: list[list[int]]) -> tuple[list[int], list[int]]:
    """Merge candidate continuations into a trie: (tokens, parents), shared prefixes stored once.

    Sorted-LCP alignment (SENSE's "loose trie"): after a lexicographic sort, the prefix a sequence
    shares with any earlier one is at most what it shares with its sorted predecessor, so one pass
    that reuses the predecessor's first LCP nodes builds the trie. Duplicates add no nodes.
    """
    tokens: list[int] = []
    parents: list[int] = []
    prev: list[int] = []
    prev_nodes: list[int] = []
    for seq in sorted(list(s) for s in sequences):
        lcp = 0
        while lcp < min(len(seq), len(prev)) and seq[lcp] == prev[lcp]:
            lcp += 1
        nodes = prev_nodes[:lcp]
        for token in seq[lcp:]:
            parents.append(nodes[-1] if nodes else -1)
            tokens.append(token)
            nodes.append(len(tokens) - 1)
        prev, prev_nodes = seq, nodes
    return tokens, parents


def draft_from_sequences(sequences: list[list[int]], device: torch.device | str = "cpu") -> Draft:
    """A Draft of the merged candidates: a chain when they form one path, else a tree."""
    tokens, parents = merge_sequences([s for s in sequences if len(s)])
    if not tokens:
        return Draft.empty(1, device)
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    if parents == list(range(-1, len(parents) - 1)):
        return Draft(tokens=ids)
    return Draft(tokens=ids, parents=torch.tensor(parents, dtype=torch.long))
