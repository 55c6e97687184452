"""Building a SENSE datastore (offline): the target's hidden states over a corpus, reduced and saved.

Collection runs the target over (prompt, answer) texts in shards that a rerun keeps, so a killed
build resumes; the reduction (z-score, PCA, L2 norm) makes the `Datastore` that retrieval loads.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .datastore import SEPARATOR, Datastore, DatastoreError


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
    meta = {"model": model_name, "corpus": corpus, "texts": texts, "dim": dim,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
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
