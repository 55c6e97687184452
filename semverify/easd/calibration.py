"""Per-model entropy percentiles, so EASD thresholds can be given as percentiles (runtime: load and look up).

A calibration is a small JSON file found by model name (see `find_calibration`); it is made by
`semverify.easd.calibrate.calibrate_entropy`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..model_cache import cache_root, model_key, per_model_file

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
        calibration = cls(**json.loads(Path(path).read_text()))
        calibration.source = str(path)  # the file it came from (runs pin it by content)
        return calibration


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
        "or give raw thresholds draft_entropy and target_entropy (nats)")
