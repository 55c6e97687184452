"""Token trees: one target forward over many draft branches, their masks and positions, KV compaction.

A tree draft is a flat list of n tokens with ``parents[i] < i`` (-1: a child of the last accepted
token, the "root"). The target sees ``[root, t_0, ..., t_{n-1}]`` with a 4-D attention mask in which
each node attends to the cache, the root and its own ancestors, and with depth-based positions, so
every branch is scored exactly as if it had been verified alone (SpecInfer, REST, EAGLE). Sliding-window
layers further limit each node to the keys within its window of token positions (`RowCache.inputs` applies
each layer type's window to `rows_tree_allowed`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..types import Draft
from .architectures import UnsupportedCacheError


def depths(parents: torch.LongTensor) -> torch.LongTensor:
    """[n] depth of every node of ``parents`` [n]; children of the root have depth 1."""
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
    """Root-to-leaf node lists of the tree ``parents`` [n], in the order of their leaves."""
    plist = parents.tolist()
    has_child = {p for p in plist if p >= 0}
    paths = []
    for leaf in (i for i in range(len(plist)) if i not in has_child):
        path = [leaf]
        while plist[path[-1]] >= 0:
            path.append(plist[path[-1]])
        paths.append(path[::-1])
    return paths


def tree_attention_mask(parents: torch.LongTensor, past: int, unseen: int, dtype: torch.dtype,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, 1, unseen+n, past+unseen+n] additive mask (0 attends, dtype min blocks) of one row over a
    cache without holes: `rows_tree_mask` with every column real.

    The input is ``unseen`` uncached context tokens (the last of them is the root), then the n nodes:
    context tokens are causal, each node sees the cache, all context tokens and its own ancestors.
    """
    every = torch.ones(1, past + unseen, dtype=torch.bool)
    return rows_tree_mask(parents[None], every[:, :past], every[:, past:], dtype, device)


def rows_tree_mask(parents: torch.LongTensor, past_valid: torch.BoolTensor, unseen_valid: torch.BoolTensor,
                   dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """[B, 1, W+n, past+W+n] additive mask (0 attends, dtype min blocks) of `rows_tree_allowed`, for layers that
    see every earlier token (a sliding-window layer needs its window on top: `RowCache.inputs`)."""
    allowed = rows_tree_allowed(parents, past_valid, unseen_valid, device)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)[:, None]


def rows_tree_allowed(parents: torch.LongTensor, past_valid: torch.BoolTensor, unseen_valid: torch.BoolTensor,
                      device: torch.device | str | None = None) -> torch.BoolTensor:
    """[B, W+n, past+W+n] which keys each position of a batch may see, whose row b holds the tree ``parents[b]`` [n].

    Each row sees its real cache columns (``past_valid`` [B, past]: holes and padding are masked) and its
    real uncached tokens (``unseen_valid`` [B, W], causal, the last is the root); a node also sees its
    ancestors. Every position sees itself, so padding never leaves a row with nothing to attend to. Built on
    ``device`` (by default that of ``past_valid``); only the [n, n] ancestor blocks come from the host.
    """
    device = past_valid.device if device is None else torch.device(device)
    batch, n = parents.shape
    width = unseen_valid.shape[1]
    past_valid, unseen_valid = past_valid.to(device), unseen_valid.to(device)
    blocks: dict[tuple[int, ...], torch.BoolTensor] = {}  # rows often share a tree shape (chains, padding)
    tree = torch.stack([blocks.setdefault(tuple(p.tolist()), ancestor_mask(p)) for p in parents.cpu()]) if n else (
        torch.zeros(batch, 0, 0, dtype=torch.bool))
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    context = torch.cat([causal[None] & unseen_valid[:, None, :],
                         torch.zeros(batch, width, n, dtype=torch.bool, device=device)], dim=2)
    nodes = torch.cat([unseen_valid[:, None, :].expand(-1, n, -1), tree.to(device)], dim=2)
    allowed = torch.cat([past_valid[:, None, :].expand(-1, width + n, -1), torch.cat([context, nodes], dim=1)], dim=2)
    past = past_valid.shape[1]
    allowed[:, torch.arange(width + n, device=device), past + torch.arange(width + n, device=device)] = True
    return allowed


def tree_position_ids(parents: torch.LongTensor, past: int, unseen: int,
                      device: torch.device | str = "cpu") -> torch.LongTensor:
    """[1, unseen+n] positions: context tokens in order, a node at the root's position + its depth."""
    return rows_tree_positions(parents[None], torch.tensor([past]), torch.ones(1, unseen, dtype=torch.bool)).to(device)


def rows_tree_positions(parents: torch.LongTensor, next_position: torch.LongTensor,
                        unseen_valid: torch.BoolTensor) -> torch.LongTensor:
    """[B, W+n] positions of a batched tree forward: each row's real uncached tokens from its
    ``next_position`` on, its nodes at its root's position + their depth."""
    next_position, unseen_valid = next_position.cpu(), unseen_valid.cpu()
    context = next_position[:, None] + (unseen_valid.long().cumsum(-1) - 1).clamp_min(0)
    root = next_position + unseen_valid.sum(-1) - 1
    return torch.cat([context, root[:, None] + torch.stack([depths(p) for p in parents])], dim=1)


def _check_movable(cache: DynamicCache) -> None:
    """Refuse caches whose entries cannot be moved between columns: only full `DynamicLayer`s can (a
    `DynamicSlidingWindowLayer` drops columns; quantized or recurrent layers). Caches from
    `semverify.engine.cache.new_cache` always pass, sliding-window models' included (their windows are masks)."""
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise UnsupportedCacheError(f"tree drafts need full (non-dropping) cache layers, as semverify.engine.cache."
                                        f"new_cache makes them; got {type(layer).__name__}")


def keep_paths(cache: DynamicCache, start: int, paths: list[list[int]]) -> None:
    """Move each row's kept tree nodes ``paths[b]`` (stored at start + node) to start, start+1, ..., in every row
    of a batched ``cache`` at once (one gather per layer); the caller then crops or masks what follows. A chain's
    accepted prefix is already in place."""
    if all(path == list(range(len(path))) for path in paths):
        return
    _check_movable(cache)
    width = max(max(path, default=-1) + 1 for path in paths)
    source = torch.arange(width).repeat(len(paths), 1)
    for row, path in enumerate(paths):
        source[row, : len(path)] = torch.tensor(path, dtype=torch.long)
    for layer in cache.layers:
        if layer.keys is None or not layer.keys.numel():
            continue
        index = (source + start).to(layer.keys.device)[:, None, :, None]
        for name in ("keys", "values"):
            tensor = getattr(layer, name)
            moved = tensor.gather(2, index.expand(-1, tensor.shape[1], -1, tensor.shape[3]))
            tensor[:, :, start : start + width] = moved


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
