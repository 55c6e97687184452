"""Token trees: one target forward over many draft branches, their masks and positions, KV compaction.

A tree draft is a flat list of n tokens with ``parents[i] < i`` (-1: a child of the last accepted
token, the "root"). The target sees ``[root, t_0, ..., t_{n-1}]`` with a 4-D attention mask in which
each node attends to the cache, the root and its own ancestors, and with depth-based positions, so
every branch is scored exactly as if it had been verified alone (SpecInfer, REST, EAGLE).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .cache import UnsupportedCacheError
from .types import Draft


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
