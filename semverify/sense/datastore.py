"""SENSE's static datastore: the target's own hidden states over a corpus, keyed to what followed.

Every answer-token position t of the corpus gives one entry: the target's final-layer hidden state
at t (the state that predicted token t+1), reduced DReSD-style (z-score, PCA, L2 norm, fp16), and
its place in the concatenated corpus tokens, where the continuation t+1, t+2, ... is read. The same
token array serves exact suffix lookup (REST), so one file holds both halves of SENSE's retrieval.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

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


@torch.inference_mode()
def collect_states(model, tokenizer, examples: Sequence[tuple[str, str]], out_dir: str | os.PathLike,
                   shard_size: int = 64, progress: bool = True) -> Path:
    """Forward the model over (prompt, answer) pairs; save answer-position hidden states and tokens in
    shards of ``shard_size`` texts under ``out_dir``. Finished shards are kept, so a rerun resumes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_same_corpus(out_dir, examples)
    device = next(model.parameters()).device
    n_shards = (len(examples) + shard_size - 1) // shard_size
    bar = tqdm(total=len(examples), desc="datastore states", unit="text", disable=not progress)
    for s in range(n_shards):
        path = out_dir / f"shard{s:05d}.pt"
        chunk = examples[s * shard_size : (s + 1) * shard_size]
        if path.exists():
            bar.update(len(chunk))
            continue
        states, tokens = [], []
        for prompt, answer in chunk:
            p_ids = tokenizer(prompt, add_special_tokens=False).input_ids
            a_ids = tokenizer(answer, add_special_tokens=False).input_ids
            if not a_ids:
                bar.update(1)
                continue
            ids = torch.tensor([p_ids + a_ids], device=device)
            hidden = model(input_ids=ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1]
            # the state at the last prompt token predicts a_ids[0]: keep it and those of a_ids[:-1]
            states.append(hidden[0, len(p_ids) - 1 : -1].to(torch.float16).cpu())
            tokens.append(torch.tensor(a_ids, dtype=torch.int32))
            bar.update(1)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"states": states, "tokens": tokens}, tmp)
        os.replace(tmp, path)
    bar.close()
    return out_dir


def _check_same_corpus(out_dir: Path, examples: Sequence[tuple[str, str]]) -> None:
    """Shards are numbered by text: resuming over another corpus would mix the two, so refuse it."""
    digest = hashlib.sha256(json.dumps(list(map(list, examples))).encode()).hexdigest()
    stamp = out_dir / "corpus.sha256"
    if stamp.is_file() and stamp.read_text().strip() != digest:
        raise DatastoreError(f"{out_dir} holds states of another corpus (other texts, limit or corpus kind); "
                             "delete it or build to another --out")
    stamp.write_text(digest)


def build_datastore(shard_dir: str | os.PathLike, dim: int = 256, model_name: str = "", corpus: str = "",
                    pca_sample: int = 50_000, seed: int = 0) -> Datastore:
    """Reduce collected states into a Datastore: z-score, PCA to ``dim`` (fit on a sample), L2 norm."""
    shards = sorted(Path(shard_dir).glob("shard*.pt"))
    if not shards:
        raise DatastoreError(f"no collected states under {shard_dir}")
    states, tokens, positions, offset, texts = [], [], [], 0, 0
    for path in shards:
        blob = torch.load(path, weights_only=True)
        for s, t in zip(blob["states"], blob["tokens"]):
            # entry j of this text is the state before answer token j; its continuation starts at j
            states.append(s)
            positions.append(torch.arange(offset, offset + len(t)))
            tokens.append(t.numpy())
            tokens.append(np.array([SEPARATOR], dtype=np.int32))
            offset += len(t) + 1
            texts += 1
    if not states:
        raise DatastoreError(f"the states under {shard_dir} hold no answer tokens: the datastore would be empty")
    raw = torch.cat(states).float()
    mean, scale = raw.mean(0), raw.std(0).clamp_min(1e-6)
    g = torch.Generator().manual_seed(seed)
    sample = ((raw - mean) / scale)[torch.randperm(len(raw), generator=g)[:pca_sample]]
    dim = min(dim, raw.shape[1], len(sample))
    _, _, v = torch.linalg.svd(sample, full_matrices=False)
    components = v[:dim].T.contiguous()  # [H, d]
    keys = torch.nn.functional.normalize(((raw - mean) / scale) @ components, dim=-1).half().float()
    meta = {"model": model_name, "corpus": corpus, "texts": texts, "dim": dim, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return Datastore(keys, torch.cat(positions), np.concatenate(tokens), mean, scale, components, meta)


def describe(store: Datastore) -> dict:
    """Size figures for reports: entries, bytes per entry and the in-memory total."""
    disk = store.keys.numel() * 2 + store.positions.numel() * 8 + store.tokens.nbytes + store.components.numel() * 4
    ram = disk + store.keys.numel() * 2  # keys are fp32 in memory
    return {"entries": store.size, "dim": int(store.keys.shape[1]), "bytes_per_entry_disk": disk / max(store.size, 1),
            "disk_mb": disk / 2**20, "ram_mb": ram / 2**20,
            **{k: store.meta.get(k) for k in ("model", "corpus", "texts")}}


def timed_build(model, tokenizer, examples, out: str | os.PathLike, dim: int = 256, model_name: str = "",
                corpus: str = "", shard_size: int = 64) -> tuple[Datastore, dict]:
    """Collect (resumable, under ``out``.parts/), reduce and save; returns the store and build figures."""
    out = Path(out)
    start = time.perf_counter()
    collect_states(model, tokenizer, examples, out.with_name(out.name + ".parts"), shard_size)
    store = build_datastore(out.with_name(out.name + ".parts"), dim, model_name, corpus)
    store.meta["build_seconds_this_run"] = round(time.perf_counter() - start, 1)
    store.save(out)
    seconds = store.meta["build_seconds_this_run"]
    info = {**describe(store), "build_seconds_this_run": seconds, "path": str(out),
            "entries_per_second_this_run": round(store.size / seconds, 1) if seconds else None}
    out.with_suffix(".json").write_text(json.dumps(info, indent=2))
    return store, info
