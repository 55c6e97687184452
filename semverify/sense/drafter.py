"""Retrieval drafting (SENSE's SEN, and REST/DReSD as special cases): candidates from exact suffix
matches and from the target's own hidden states, ranked by a composite score, merged into a trie."""

from __future__ import annotations

import numpy as np
import torch

from ..drafters.base import BaseDrafter
from ..engine.sampling import Sampler
from ..engine.tree import draft_from_sequences, merge_sequences
from ..types import Draft
from .datastore import Datastore


class RetrievalDrafter(BaseDrafter):
    """Drafts up to ``num_candidates`` continuations (each at most k tokens) as one tree.

    - lexical (REST): the longest suffix of the context, up to ``max_ngram`` tokens, matched exactly
      in the datastore corpus (its most frequent continuations first) and in the context itself;
      score ``lexical_weight * n / max_ngram``.
    - semantic (SEN, DReSD): cosine nearest neighbours of the target's hidden state at the last
      accepted position, among static keys and the keys of this generation's accepted positions (the
      dynamic store). The state predicted the token just emitted, so a neighbour is kept only if its
      next corpus token equals that token (DReSD's filter); score ``semantic_weight * cosine``.
    ``lexical_weight >> semantic_weight`` ranks exact matches first with cosine as the tie-break, as SENSE's Eq. 8 does.
    Candidates join the trie in rank order while it stays within ``max_nodes`` tokens (measured here:
    a 1.5B forward over 64 tokens costs 1.7x one over 1 token on 2 CPU cores).
    """

    batching = "copies"  # one copy per row of a batch: its query and dynamic store are the row's own

    def __init__(self, datastore: Datastore | None = None, num_candidates: int = 10, lexical: bool = True,
                 semantic: bool = True, max_ngram: int = 8, lexical_weight: float = 1.0,
                 semantic_weight: float = 0.01,
                 pool: int = 64, dynamic: bool = True, max_nodes: int = 64, semantic_slots: int = 0) -> None:
        if not (lexical or semantic):
            raise ValueError("a retrieval drafter needs lexical or semantic retrieval (or both)")
        if semantic and datastore is None and not dynamic:
            raise ValueError("semantic retrieval needs a datastore or the dynamic store")
        if min(num_candidates, max_ngram, pool, max_nodes) < 1:
            raise ValueError("num_candidates, max_ngram, pool and max_nodes must be >= 1")
        if not 0 <= semantic_slots <= num_candidates:
            raise ValueError(f"semantic_slots must be in [0, num_candidates={num_candidates}], got {semantic_slots}")
        self.store, self.n, self.lexical, self.semantic = datastore, num_candidates, lexical, semantic
        self.max_ngram, self.pool, self.dynamic = max_ngram, pool, dynamic
        self.lexical_weight, self.semantic_weight = lexical_weight, semantic_weight
        self.max_nodes, self.semantic_slots = max_nodes, semantic_slots
        self.needs_target_hidden = semantic
        self.reset(None)

    def reset(self, input_ids: torch.LongTensor | None) -> None:
        self.query: torch.Tensor | None = None
        self.dyn_keys: list[torch.Tensor] = []
        self.dyn_pos: list[int] = []
        self._start = 0

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler,
                generator: torch.Generator | None) -> Draft:
        self._start = input_ids.shape[1]
        seq = input_ids[0].tolist()
        scored: dict[tuple[int, ...], float] = {}
        if self.lexical:
            self._lexical(seq, k, scored)
        semantic: dict[tuple[int, ...], float] = {}
        if self.semantic and self.query is not None:
            self._semantic(seq, k, semantic)
        for cont, score in semantic.items():
            scored[cont] = max(score, scored.get(cont, float("-inf")))
        chosen: list[list[int]] = []
        size = 0
        for cont in self._ranked(scored, semantic):
            grown = len(merge_sequences(chosen + [list(cont)])[0])
            if grown > self.max_nodes:  # the verification forward grows with the tree: keep it bounded
                room = self.max_nodes - size  # the candidate's new nodes are its tail: cut the tail to fit
                if room > 0:
                    chosen.append(list(cont[: len(cont) - (grown - size - room)]))
                break
            chosen.append(list(cont))
            size = grown
        return draft_from_sequences(chosen, input_ids.device)

    def _ranked(self, scored: dict, semantic: dict) -> list[tuple[int, ...]]:
        """The candidates to merge, best first: with ``semantic_slots``, that many hidden-state candidates go
        first (exact suffix matches outrank them by score, so otherwise they rarely make the tree)."""
        reserved = sorted(semantic, key=lambda c: -semantic[c])[: self.semantic_slots]
        rest = [c for c in sorted(scored, key=lambda c: -scored[c]) if c not in reserved]
        return (reserved + rest)[: self.n]

    def _add(self, scored: dict, cont: list[int], score: float) -> None:
        if cont:
            key = tuple(cont)
            scored[key] = max(score, scored.get(key, float("-inf")))

    def _lexical(self, seq: list[int], k: int, scored: dict) -> None:
        """Longest exact suffix matches first, in the static corpus then the context itself."""
        context = np.asarray(seq, dtype=np.int64)
        for n in range(min(self.max_ngram, len(seq) - 1), 0, -1):
            suffix = seq[-n:]
            if self.store is not None:
                for pos in self.store.suffix_matches(suffix, self.n).tolist():
                    self._add(scored, self.store.continuation(pos, k), self.lexical_weight * n / self.max_ngram
                              + self.semantic_weight * self._cosine_at(pos - 1))
            windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)
            for start in np.nonzero((windows == context[-n:]).all(axis=1))[0][::-1][: self.n].tolist():
                self._add(scored, seq[start + n : start + n + k], self.lexical_weight * n / self.max_ngram)
            if len(scored) >= self.n:
                return

    def _semantic(self, seq: list[int], k: int, scored: dict) -> None:
        last = seq[-1]
        if self.store is not None:
            cos, idx = self.store.nearest(self.query, self.pool)
            for c, i in zip(cos.tolist(), idx.tolist()):
                cont = self.store.continuation(int(self.store.positions[i]), k + 1)
                if len(cont) > 1 and cont[0] == last:
                    self._add(scored, cont[1:], self.semantic_weight * c)
        if self.dynamic and self.dyn_keys:
            keys = torch.stack(self.dyn_keys)
            cos = keys @ self.query
            for c, j in zip(*(t.tolist() for t in torch.topk(cos, min(self.pool, len(cos))))):
                pos = self.dyn_pos[j]
                if pos < len(seq) - 1 and seq[pos] == last:
                    self._add(scored, seq[pos + 1 : pos + 1 + k], self.semantic_weight * c)

    def _cosine_at(self, entry_position: int) -> float:
        """Cosine between the query and the static key stored for corpus position ``entry_position``."""
        if self.query is None or not self.semantic:
            return 0.0
        i = int(torch.searchsorted(self.store.positions, torch.tensor(entry_position)))
        if i >= self.store.size or int(self.store.positions[i]) != entry_position:
            return 0.0
        return float(self.store.keys[i].float() @ self.query)

    def commit(self, n_accepted: int, next_token: torch.LongTensor, target_hidden=None) -> None:
        """Keep the state that predicted ``next_token`` as the next query; grow the dynamic store."""
        if target_hidden is None or not self.semantic:
            return
        rows = target_hidden[0, : n_accepted + 1]
        reduced = self.store.reduce(rows) if self.store is not None else torch.nn.functional.normalize(
            rows.float(), dim=-1)
        self.query = reduced[-1]
        if self.dynamic:
            # row i is the state at position start-1+i, which predicted the token at start+i
            self.dyn_keys.extend(reduced)
            self.dyn_pos.extend(range(self._start, self._start + n_accepted + 1))
