"""Per-model entropy percentiles by teacher forcing, so EASD thresholds can be given as percentiles.

EASD's thresholds are "an entropy percentile on a validation set": run each model over reference
answers, record the entropy of its next-token distribution at every answer token, and keep the
percentiles. A calibration is a small JSON file found by model name (see :func:`find_calibration`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from ..models import cache_root, model_key, per_model_file
from ..rules import entropy

SHIPPED = Path(__file__).parent / "calibrations"
PERCENTILES = torch.arange(101, dtype=torch.float64)  # entropies stored at the 0th..100th percentile


@dataclass
class EntropyCalibration:
    """Entropy (nats) at the 0..100th percentiles, per sampling temperature, for one model."""

    model: str
    vocab_size: int
    corpus: str
    n_texts: int
    n_tokens: int
    quantiles: dict[str, list[float]]  # temperature (as written by format_temperature) -> 101 values
    created: str = ""

    def threshold(self, percentile: float, temperature: float = 1.0, normalize: bool = False) -> float:
        """Entropy at ``percentile`` (linear between stored integers) for decoding at ``temperature``."""
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {percentile}")
        key = format_temperature(temperature)
        if key not in self.quantiles:
            raise ValueError(f"the calibration of {self.model} has temperatures {sorted(self.quantiles)}, not "
                             f"{key}; rerun `semverify calibrate --model {self.model} --temperatures {key}`")
        values = self.quantiles[key]
        lo = int(math.floor(percentile))
        hi = min(lo + 1, 100)
        value = values[lo] + (percentile - lo) * (values[hi] - values[lo])
        return value / math.log(self.vocab_size) if normalize else value

    def save(self, path: str | os.PathLike) -> Path:
        """Write the JSON atomically; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "EntropyCalibration":
        return cls(**json.loads(Path(path).read_text()))


def format_temperature(temperature: float) -> str:
    """The key a temperature is stored under ("1", "0.7")."""
    return f"{float(temperature):g}"


def calibration_path(name_or_path: str | os.PathLike) -> Path:
    """Where ``semverify calibrate`` saves a model's calibration by default."""
    return cache_root() / "entropy" / f"{model_key(name_or_path)}.json"


def find_calibration(name_or_path: str | os.PathLike) -> EntropyCalibration:
    """A calibration from a JSON path, else by model name: the user's cache first, then shipped ones."""
    if str(name_or_path).endswith(".json"):
        if not Path(name_or_path).is_file():
            raise FileNotFoundError(f"entropy calibration file not found: {name_or_path}")
        return EntropyCalibration.load(name_or_path)
    found = per_model_file(name_or_path, "entropy", ".json", SHIPPED)
    if found is not None:
        return EntropyCalibration.load(found)
    raise FileNotFoundError(
        f"no entropy calibration for {name_or_path!r}; run `semverify calibrate --model {name_or_path}` "
        "or give raw thresholds tau_q and tau_p")


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
