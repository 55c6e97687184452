"""Entropy calibration by teacher forcing (offline): a model's entropy percentiles over reference answers.

EASD's thresholds are "an entropy percentile on a validation set": run each model over reference
answers, record the entropy of its next-token distribution at every answer token, and keep the
percentiles in an `EntropyCalibration` (see `semverify.easd.calibration`).
"""

from __future__ import annotations

import datetime
from typing import Sequence

import torch
from tqdm.auto import tqdm

from ..rules import entropy
from .calibration import PERCENTILES, EntropyCalibration, format_temperature


@torch.inference_mode()
def calibrate_entropy(
    model,
    tokenizer,
    examples: Sequence[tuple[str, str]],
    temperatures: Sequence[float] = (1.0, 0.7),
    model_name: str | None = None,
    corpus: str = "",
    progress: bool = True,
) -> EntropyCalibration:
    """Teacher-force ``model`` over (prompt, answer) text pairs and record its answer-token entropies.

    Entropy is taken over ``softmax(logits / T)`` for each temperature T (top-k/top-p are not applied),
    at every position that predicts an answer token, so it matches what the rule sees when decoding.
    """
    if not examples:
        raise ValueError("calibration needs at least one (prompt, answer) example")
    device = next(model.parameters()).device
    per_temp: dict[str, list[torch.Tensor]] = {format_temperature(t): [] for t in temperatures}
    vocab_size = 0
    for prompt, answer in tqdm(examples, desc=f"calibrate {model_name or ''}".strip(), unit="text",
                               disable=not progress):
        p_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        a_ids = tokenizer(answer, add_special_tokens=False).input_ids
        if not a_ids:
            continue
        ids = torch.tensor([p_ids + a_ids], device=device)
        logits = model(input_ids=ids, logits_to_keep=len(a_ids) + 1).logits[0, :-1].float()
        vocab_size = logits.shape[-1]
        for t in temperatures:
            per_temp[format_temperature(t)].append(entropy(torch.softmax(logits / t, dim=-1)).cpu())
    values = {k: torch.cat(v).double() for k, v in per_temp.items()}
    n_tokens = next(iter(values.values())).numel()
    if n_tokens == 0:
        raise ValueError("the calibration examples have no answer tokens")
    return EntropyCalibration(
        model=str(model_name or getattr(model, "name_or_path", "model")),
        vocab_size=vocab_size,
        corpus=corpus, n_texts=len(examples), n_tokens=n_tokens,
        quantiles={k: [round(float(x), 6) for x in torch.quantile(v, PERCENTILES / 100)] for k, v in values.items()},
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
