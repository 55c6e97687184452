"""A draft model that proposes a token tree: where the draft is unsure it keeps its runner-up tokens too
(SpecInfer, Sequoia and EAGLE-2 do the same), and the target verifies every branch in one forward.

The tree grows one depth at a time: the nodes of a new depth go through the draft model in one forward
under a tree mask (each node sees the sequence and its own ancestors), within a node budget. Where a
verification forward over 24 tokens costs little more than over 1 (a memory-bound device), the
alternatives buy accepted length almost for free. Greedy decoding: the target's greedy path through
the tree is what plain decoding writes. Sampling: the tree is chosen without the target's draws, so
speculative sampling over it sibling by sibling is exact (`semverify.engine.verification.sample_tree`).
"""

from __future__ import annotations

import math

import torch
from transformers import PreTrainedModel

from ..engine.architectures import layout
from ..engine.cache import keep_first, new_cache
from ..engine.sampling import Sampler
from ..engine.tree import ancestor_mask, depths, keep_path
from ..types import Draft, eos_ids
from .base import BaseDrafter


class ModelTreeDrafter(BaseDrafter):
    """Trees of up to ``budget`` draft tokens and depth k: every node gets the draft's top token as a child,
    and its next ``branch - 1`` tokens too when the top token's probability is below ``threshold``.
    Parents are served in the order of their path probability, so the budget goes to the likeliest
    branches; a branch ends at an end-of-sequence token."""

    gives_probs = False  # deterministic proposals: the target tests each token against p alone
    batching = "copies"  # a batch drafts one tree per row, each copy with its own draft cache

    def __init__(self, model: PreTrainedModel, budget: int = 24, branch: int = 2, threshold: float = 0.6,
                 eos_token_id: int | list[int] | None = None) -> None:
        if budget < 1 or branch < 1 or not 0.0 <= threshold <= 1.0:
            raise ValueError("budget and branch must be >= 1 and threshold in [0, 1]")
        self.model, self.budget, self.branch, self.threshold = model, budget, branch, threshold
        if eos_token_id is None:
            eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos = set(eos_ids(eos_token_id))
        self.cache, self.fed, self._tree = None, 0, None
        self.layout = None  # the draft model's attention layout (windows, mask format), set at reset

    def reset(self, input_ids: torch.LongTensor) -> None:
        self.cache = new_cache(self.model, role="draft model")
        self.layout = layout(self.model)
        self.fed = 0  # tokens of the sequence held, in order, at the start of the cache
        self._tree: tuple[list[int], list[int], int] | None = None  # last tree: tokens, parents, nodes cached

    @torch.inference_mode()
    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler, generator=None) -> Draft:
        seq = input_ids[0]
        self._keep_accepted(seq)
        out = self.model(input_ids=seq[None, self.fed :], cache=self.cache, use_cache=True, logits_to_keep=1)
        self.fed = len(seq)
        tokens, parents = [], []
        frontier = [(-1, 0.0, out.logits[0, -1].float())]  # (node, path log-probability, its next-token logits)
        cached = 0
        for depth in range(1, k + 1):
            children = self._children(frontier, self.budget - len(tokens))
            if not children:
                break
            first = len(tokens)
            tokens += [token for _, token, _ in children]
            parents += [parent for parent, _, _ in children]
            if depth == k or len(tokens) >= self.budget:
                break
            logits = self._forward(tokens, parents, first, input_ids.device)
            cached = len(tokens)
            frontier = [(first + j, logp, logits[j]) for j, (_, token, logp) in enumerate(children)
                        if token not in self.eos]
        self._tree = (tokens, parents, cached)
        if not tokens:
            return Draft.empty(1, input_ids.device)
        ids = torch.tensor([tokens], device=input_ids.device)
        if parents == list(range(-1, len(tokens) - 1)):
            return Draft(ids)
        return Draft(ids, parents=torch.tensor(parents, dtype=torch.long))

    def _children(self, frontier: list, room: int) -> list[tuple[int, int, float]]:
        """(parent, token, path log-probability) of the next depth's nodes: likeliest parents first, at most
        ``room`` of them."""
        children = []
        for node, logp, logits in sorted(frontier, key=lambda f: -f[1]):
            top = logits.softmax(-1).topk(self.branch)
            width = self.branch if float(top.values[0]) < self.threshold else 1
            for p, token in zip(top.values[:width].tolist(), top.indices[:width].tolist()):
                if len(children) == room:
                    return children
                children.append((node, token, logp + math.log(max(p, 1e-30))))
        return children

    def _forward(self, tokens: list[int], parents: list[int], first: int, device) -> torch.Tensor:
        """The draft's next-token logits [m, V] at the nodes ``first..``, fed in one forward: node i sits at
        cache column fed + i, and sees the sequence and its ancestors (the nodes before ``first`` are cached),
        within each layer's window of positions."""
        tree = torch.tensor(parents, dtype=torch.long)
        seen = torch.cat([torch.ones(len(tokens) - first, self.fed, dtype=torch.bool), ancestor_mask(tree)[first:]],
                         dim=1)
        node_positions = self.fed - 1 + depths(tree)
        keys = torch.cat([torch.arange(self.fed), node_positions])
        mask = self.layout.masks(seen[None].to(device), node_positions[None, first:].to(device), keys[None].to(device))
        out = self.model(input_ids=torch.tensor([tokens[first:]], device=device), cache=self.cache, use_cache=True,
                         attention_mask=mask, position_ids=node_positions[None, first:].to(device))
        return out.logits[0].float()

    def _keep_accepted(self, seq: torch.LongTensor) -> None:
        """Roll the cache back to the sequence and the cached nodes of the path the target accepted, found
        by walking the last tree along the sequence's new tokens (each path's tokens are unique: a trie)."""
        if self._tree is None:
            return
        tokens, parents, cached = self._tree
        path, node = [], -1
        for token in seq[self.fed :].tolist():
            node = next((i for i in range(len(tokens)) if parents[i] == node and tokens[i] == token), None)
            if node is None:
                break
            path.append(node)
        kept = [i for i in path if i < cached]
        keep_path(self.cache, self.fed, kept)
        keep_first(self.cache, self.fed + len(kept))
        self.fed += len(kept)
        self._tree = None
