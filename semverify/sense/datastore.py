"""SENSE's static datastore: the target's own hidden states over a corpus, keyed to what followed.

Every answer-token position t of the corpus gives one entry: the target's final-layer hidden state
at t (the state that predicted token t+1), reduced DReSD-style (z-score, PCA, L2 norm, fp16), and
its place in the concatenated corpus tokens, where the continuation t+1, t+2, ... is read. The same
token array serves exact suffix lookup (REST), so one file holds both halves of SENSE's retrieval.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

FORMAT = 1
SEPARATOR = -1  # between texts in the token array: no suffix match or continuation crosses it


class DatastoreError(ValueError):
    """A datastore that cannot serve this model or cannot be read."""


@dataclass
class Datastore:
    """Reduced keys [N, d] (unit norm; fp16 on disk, fp32 in memory for fast CPU search), their token
    positions [N] (increasing), and the corpus tokens [T] with SEPARATOR between texts."""

    keys: torch.Tensor
    positions: torch.Tensor
    tokens: np.ndarray
    mean: torch.Tensor
    scale: torch.Tensor
    components: torch.Tensor  # [H, d]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._sorted: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.index = None  # an optional FAISS index over ``keys`` (see build_faiss_index)

    def build_faiss_index(self, nlist: int = 1024, pq_m: int = 32, nprobe: int = 32, seed: int = 0):
        """Approximate search for large stores: a FAISS IVF-PQ inner-product index over the keys (the
        authors' choice), trained on the keys themselves. Needs ``pip install semverify[faiss]``."""
        try:
            import faiss
        except ImportError as err:
            raise ImportError("the FAISS index needs faiss-cpu: pip install 'semverify[faiss]'") from err
        d = self.keys.shape[1]
        nlist = max(1, min(nlist, self.size // 39))  # FAISS wants ~39 training points per list
        quantizer = faiss.IndexFlatIP(d)
        if d % pq_m or self.size < 256 * 39:  # too small for 8-bit PQ codes: inverted lists of full vectors
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexIVFPQ(quantizer, d, nlist, pq_m, 8, faiss.METRIC_INNER_PRODUCT)
        keys = np.ascontiguousarray(self.keys.numpy(), dtype=np.float32)
        index.cp.seed = seed
        index.train(keys)
        index.add(keys)
        index.nprobe = min(nprobe, nlist)
        self.index, self._quantizer = index, quantizer  # the IVF index does not own its quantizer in Python
        return index

    @property
    def size(self) -> int:
        return int(self.keys.shape[0])

    @property
    def hidden_size(self) -> int:
        return int(self.components.shape[0])

    def reduce(self, hidden: torch.Tensor) -> torch.Tensor:
        """Map raw final-layer hidden states [..., H] into key space [..., d] (unit norm, fp32)."""
        if hidden.shape[-1] != self.hidden_size:
            raise DatastoreError(f"this datastore was built for hidden size {self.hidden_size} "
                                 f"({self.meta.get('model')}); got hidden states of size {hidden.shape[-1]}")
        z = (hidden.float() - self.mean) / self.scale
        return torch.nn.functional.normalize(z @ self.components, dim=-1)

    def nearest(self, query: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact cosine search: (scores, entry indices) of the n nearest keys to one reduced query [d]."""
        if self.index is not None:
            scores, idx = self.index.search(np.ascontiguousarray(query.float().numpy()[None]), min(n, self.size))
            keep = idx[0] >= 0
            return torch.from_numpy(scores[0][keep]), torch.from_numpy(idx[0][keep])
        top = torch.topk(self.keys @ query.float(), min(n, self.size))
        return top.values, top.indices

    def continuation(self, position: int, length: int) -> list[int]:
        """Up to ``length`` corpus tokens from ``position`` on, stopping at a text boundary."""
        out = self.tokens[position : position + length]
        cut = np.nonzero(out == SEPARATOR)[0]
        return out[: cut[0] if len(cut) else len(out)].tolist()

    def suffix_matches(self, suffix: Sequence[int], limit: int) -> np.ndarray:
        """Positions just after occurrences of ``suffix`` in the corpus (REST's exact lookup): one per
        distinct continuation (its next ``_rank_tokens`` tokens), the most frequent first, up to ``limit``.

        Ranking by frequency is REST's choice too; replaying the 1.5B's greedy GSM8K outputs, it raised
        the tau of suffix retrieval over corpus order from 1.85 to 1.93 (OOD store).
        """
        if not suffix or len(suffix) > self._window:
            return np.empty(0, dtype=np.int64)
        order, rows, padded = self._suffix_index()
        probe = np.asarray(suffix, dtype=np.int64)
        lo, hi = 0, len(order)
        for j, tok in enumerate(probe):  # narrow the sorted range one column at a time
            column = rows[lo:hi, j]
            lo, hi = lo + int(np.searchsorted(column, tok, "left")), lo + int(np.searchsorted(column, tok, "right"))
            if lo >= hi:
                return np.empty(0, dtype=np.int64)
        after = np.sort(order[lo:hi]) + len(probe)
        following = padded[after[:, None] + np.arange(self._rank_tokens)]
        _, first, counts = np.unique(following, axis=0, return_index=True, return_counts=True)
        return after[first[np.lexsort((first, -counts))[:limit]]]  # ties: the earliest in the corpus

    _rank_tokens = 4  # continuations are told apart, and counted, by this many next tokens (<= _window)
    _window = 8  # longest suffix the exact lookup matches

    def _suffix_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Corpus start positions sorted by their next ``_window`` tokens, those token rows, and the
        corpus tokens padded with ``_window`` SEPARATORs (a continuation can be read past the end)."""
        if self._sorted is None:
            t = np.concatenate([self.tokens.astype(np.int64), np.full(self._window, SEPARATOR, dtype=np.int64)])
            rows = np.lib.stride_tricks.sliding_window_view(t, self._window)[: len(self.tokens)]
            order = np.lexsort(rows.T[::-1])
            self._sorted = (order, rows[order], t)
        return self._sorted

    def check_model(self, model_name: str | None, hidden_size: int) -> None:
        """Refuse a target whose hidden size differs; warn-free when names are unknown."""
        if hidden_size != self.hidden_size:
            raise DatastoreError(f"datastore built for {self.meta.get('model')} (hidden size {self.hidden_size}) "
                                 f"cannot serve a target with hidden size {hidden_size}")
        built_for = self.meta.get("model")
        if model_name and built_for and Path(str(model_name)).name != Path(str(built_for)).name:
            raise DatastoreError(f"datastore built for {built_for}, not {model_name}; rebuild it with "
                                 f"`semverify datastore --model {model_name}`")

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        torch.save({"format": FORMAT, "keys": self.keys.half(), "positions": self.positions,
                    "tokens": torch.from_numpy(self.tokens), "mean": self.mean, "scale": self.scale,
                    "components": self.components, "meta": self.meta}, tmp)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Datastore":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"datastore not found: {path} (build one with `semverify datastore`)")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # truncated or foreign file
            raise DatastoreError(f"{path} is not a readable semverify datastore ({type(err).__name__}: {err})") from err
        if not isinstance(blob, dict) or blob.get("format") != FORMAT:
            raise DatastoreError(f"{path} is not a semverify datastore of format {FORMAT}")
        if blob["keys"].shape[0] == 0:
            raise DatastoreError(f"{path} holds an empty datastore")
        return cls(blob["keys"].float(), blob["positions"], blob["tokens"].numpy(), blob["mean"], blob["scale"],
                   blob["components"], blob["meta"])
