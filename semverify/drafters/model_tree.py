"""A draft model that proposes a token tree: where the draft is unsure it keeps its runner-up tokens too
(SpecInfer, Sequoia and EAGLE-2 do the same), and the target verifies every branch in one forward.

The trees of all rows grow together, one depth at a time: the nodes of a new depth, in every row, go through
the draft model in one forward over one batched cache (each node sees its row's sequence and its own
ancestors), within a node budget per row. Where a verification forward over 24 tokens costs little more than
over 1 (a memory-bound device), the alternatives buy accepted length almost for free. Greedy decoding: the
target's greedy path through the tree is what plain decoding writes. Sampling: the tree is chosen without
the target's draws, so speculative sampling over it sibling by sibling is exact
(`semverify.engine.verification.sample_tree`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ..engine.cache import RowCache
from ..engine.drafting import pad_drafts
from ..engine.sampling import Sampler
from ..engine.step import left_pad
from ..engine.tree import keep_paths
from ..types import Draft, eos_ids
from .base import BaseDrafter


@dataclass
class Tree:
    """One row's tree as it grows: tokens, parents (-1: the root), path log-probabilities, and the cache column
    (from the step's first tree column) of each node fed to the draft model (None: not fed)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    columns: list[int | None] = field(default_factory=list)

    def draft(self, device: torch.device) -> Draft:
        """The tree as a one-row draft (a chain when it never branched)."""
        if not self.tokens:
            return Draft.empty(1, device)
        ids = torch.tensor([self.tokens], device=device)
        if self.parents == list(range(-1, len(self.tokens) - 1)):
            return Draft(ids)
        return Draft(ids, parents=torch.tensor(self.parents, dtype=torch.long))

    def fed_path(self, tokens: list[int]) -> list[int]:
        """The columns of the fed nodes along the path that ``tokens`` (the row's new tokens) walk from the root
        (each path's tokens are unique: a trie)."""
        path, node = [], -1
        for token in tokens:
            node = next((i for i in range(len(self.tokens)) if self.parents[i] == node and self.tokens[i] == token),
                        None)
            if node is None or self.columns[node] is None:
                break
            path.append(self.columns[node])
        return path

    def ancestors(self, node: int) -> list[int]:
        """The columns of ``node``'s ancestors (all fed: a node is only fed after its parent)."""
        out = []
        while self.parents[node] >= 0:
            node = self.parents[node]
            out.append(self.columns[node])
        return out


class ModelTreeDrafter(BaseDrafter):
    """Trees of up to ``budget`` draft tokens and depth k per row: every node gets the draft's top token as a
    child, and its next ``branch - 1`` tokens too when the top token's probability is below ``threshold``.
    Parents are served in the order of their path probability, so the budget goes to the likeliest
    branches; a branch ends at an end-of-sequence token."""

    gives_probs = False  # deterministic proposals: the target tests each token against p alone
    batching = "rows"  # one draft cache serves every row; a depth of every row's tree is one forward

    def __init__(self, model: PreTrainedModel, budget: int = 24, branch: int = 2, threshold: float = 0.6,
                 eos_token_id: int | list[int] | None = None) -> None:
        if budget < 1 or branch < 1 or not 0.0 <= threshold <= 1.0:
            raise ValueError("budget and branch must be >= 1 and threshold in [0, 1]")
        self.model, self.budget, self.branch, self.threshold = model, budget, branch, threshold
        if eos_token_id is None:
            eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos = set(eos_ids(eos_token_id))
        self.rows: RowCache | None = None
        self.fed: list[int] = []  # tokens of each row's sequence held, in order, in the cache
        self.trees: list[Tree] = []  # each row's last tree
        self.start = 0  # the cache column where the last trees' nodes begin
        self.node_positions: torch.Tensor | None = None  # [B, columns] the positions of the last trees' columns

    def reset(self, input_ids: torch.LongTensor) -> None:
        self.reset_rows([input_ids[0]])

    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        self.rows = RowCache(self.model, len(prompts), role="draft model")
        self.fed, self.trees, self.start = [0] * len(prompts), [Tree() for _ in prompts], 0

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler, generator=None) -> Draft:
        return self.propose_rows([input_ids[0]], [k], sampler, [generator])

    @torch.inference_mode()
    def propose_rows(self, sequences: list[torch.LongTensor], ks: list[int], sampler: Sampler,
                     generators: list) -> Draft:
        """Each row's tree of depth at most ``ks[b]``: the row's unseen tokens in one forward for all rows, then one
        forward per depth for the nodes of every row that grows on."""
        self._keep_accepted(sequences)
        feed, valid = left_pad([seq[fed:] for seq, fed in zip(sequences, self.fed)])
        out = self.model(**self.rows.inputs(feed, valid), logits_to_keep=1)
        self.rows.extend(valid)
        self.fed, self.start = [len(seq) for seq in sequences], self.rows.length
        self.node_positions = torch.zeros(len(sequences), 0, dtype=torch.long, device=self.rows.device)
        self.trees = [Tree() for _ in sequences]
        frontier = [(row, -1) for row, k in enumerate(ks) if k > 0]  # (row, node) whose children come next
        logits = out.logits[[row for row, _ in frontier], -1]
        for depth in range(1, max(ks, default=0) + 1):
            children = self._grow(frontier, logits)
            frontier = [(row, node) for row, node in children if self.trees[row].tokens[node] not in self.eos
                        and depth < ks[row] and len(self.trees[row].tokens) < self.budget]
            if not frontier:
                break
            logits = self._forward(frontier, depth)
        drafts = [tree.draft(sequences[0].device) for tree in self.trees]
        return drafts[0] if len(drafts) == 1 else pad_drafts(drafts)

    def _grow(self, frontier: list[tuple[int, int]], logits: torch.Tensor) -> list[tuple[int, int]]:
        """Add the next depth's nodes to each row's tree from its ``frontier`` nodes' next-token ``logits``
        (one read of every node's top tokens): likeliest parents first, within the row's budget. Returns the
        new (row, node) pairs."""
        top = logits.float().softmax(-1).topk(self.branch)
        values, indices = top.values.tolist(), top.indices.tolist()
        order = sorted(range(len(frontier)), key=lambda i: (frontier[i][0], -self._logp(*frontier[i])))
        added = []
        for i in order:
            row, node = frontier[i]
            tree = self.trees[row]
            width = self.branch if values[i][0] < self.threshold else 1
            for p, token in zip(values[i][:width], indices[i][:width]):
                if len(tree.tokens) == self.budget:
                    break
                tree.tokens.append(token)
                tree.parents.append(node)
                tree.logps.append(self._logp(row, node) + math.log(max(p, 1e-30)))
                tree.columns.append(None)
                added.append((row, len(tree.tokens) - 1))
        return added

    def _logp(self, row: int, node: int) -> float:
        return 0.0 if node < 0 else self.trees[row].logps[node]

    def _forward(self, nodes: list[tuple[int, int]], depth: int) -> torch.Tensor:
        """The draft's next-token logits [len(nodes), V] at ``nodes`` (all at ``depth``), fed in one forward: each
        row's nodes left-aligned in new columns, each seeing its row's sequence and its ancestors, placed at the
        root's position + ``depth``, within each layer's window of positions. Masks are built on the device."""
        batch, device, length = len(self.trees), self.rows.device, self.rows.length
        slots, placed, tokens, seen = [0] * batch, [], [[0] * len(nodes) for _ in range(batch)], ([], [], [])
        for row, node in nodes:
            tree, slot = self.trees[row], slots[row]
            placed.append((row, slot))
            tokens[row][slot], tree.columns[node], slots[row] = tree.tokens[node], length - self.start + slot, slot + 1
            for column in tree.ancestors(node):
                seen[0].append(row), seen[1].append(slot), seen[2].append(self.start + column)
        width = max(slots)
        valid = torch.arange(width, device=device)[None, :] < torch.tensor(slots, device=device)[:, None]
        allowed = torch.cat([self.rows.valid[:, None, :].expand(-1, width, -1),
                             torch.eye(width, dtype=torch.bool, device=device)[None].expand(batch, -1, -1)], dim=2)
        allowed[:, :, self.start : length] = False  # earlier depths' nodes: only a node's own ancestors
        allowed[tuple(torch.tensor(index, dtype=torch.long, device=device) for index in seen)] = True
        positions = (torch.tensor(self.fed, device=device)[:, None] - 1 + depth).expand(-1, width)
        keys = torch.cat([self.rows.positions()[:, : self.start], self.node_positions, positions], dim=1)
        out = self.model(input_ids=torch.tensor(tokens, device=device)[:, :width], cache=self.rows.cache,
                         use_cache=True, attention_mask=self.rows.layout.masks(allowed, positions, keys),
                         position_ids=positions)
        self.rows.extend(valid)
        self.node_positions = torch.cat([self.node_positions, positions], dim=1)
        return out.logits[[row for row, _ in placed], [slot for _, slot in placed]]

    def _keep_accepted(self, sequences: list[torch.LongTensor]) -> None:
        """Roll each row's cache back to its sequence and the fed nodes of the path the target accepted (moved to
        the front of the tree's columns; every other tree column becomes a hole)."""
        if self.rows.length == self.start:
            return
        paths = [tree.fed_path(seq[fed:].tolist()) for tree, seq, fed in zip(self.trees, sequences, self.fed)]
        keep_paths(self.rows.cache, self.start, paths)
        width = self.rows.length - self.start
        self.rows.keep(torch.arange(width)[None, :] < torch.tensor([len(p) for p in paths])[:, None])
        self.fed = [fed + len(path) for fed, path in zip(self.fed, paths)]
        self.start = self.rows.length

    def commit_rows(self, accepted: list[int | None], next_tokens: torch.LongTensor, target_hidden=None) -> None:
        pass  # the next draft rolls each row back, walking its tree along the tokens the loop kept

    def feedback_rows(self, outcomes: list) -> None:
        pass

    def keep_rows(self, rows: list[int]) -> None:
        """Only ``rows`` draft on. The last trees' columns are dropped first (their accepted nodes are fed again
        at the next draft): leaving rows may repack the cache, which would move those columns."""
        self.rows.keep(torch.zeros(1, self.rows.length - self.start, dtype=torch.bool))
        self.rows.select(torch.tensor(rows, dtype=torch.long))
        self.fed, self.trees, self.start = [self.fed[i] for i in rows], [Tree() for _ in rows], self.rows.length
