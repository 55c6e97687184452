"""Semantic-probability probes: a small MLP from a mean-pooled hidden state to the probability that the
model would write a step with this meaning (the size of its meaning cluster among the model's samples)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn


class ProbeError(ValueError):
    """A probe that does not fit the model it is asked to serve, or cannot be read."""


class SemanticProbe(nn.Module):
    """hidden [.., D] -> Linear(D, H) -> ReLU -> Dropout(0.3) -> Linear(H, 256) -> ReLU -> Linear(256, 1) -> sigmoid."""

    def __init__(self, hidden_size: int, width: int = 512, model: str = "", meta: dict | None = None) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.ReLU(), nn.Dropout(0.3),
                                 nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 1))
        self.hidden_size, self.width, self.model, self.meta = hidden_size, width, model, dict(meta or {})
        self.source = f"a probe for {model or 'an unnamed model'}"  # the file, once saved or loaded

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Probabilities in (0, 1), one per row of ``hidden`` (any float dtype)."""
        if hidden.shape[-1] != self.hidden_size:
            raise ProbeError(f"{self.source} reads hidden size {self.hidden_size}, got {hidden.shape[-1]}: it was "
                             f"trained for {self.model or 'another model'}")
        return torch.sigmoid(self.net(hidden.float())).squeeze(-1)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        torch.save({"format": 1, "hidden_size": self.hidden_size, "width": self.width, "model": self.model,
                    "meta": self.meta, "state": self.state_dict()}, tmp)
        os.replace(tmp, path)
        self.source = str(path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, model: str | None = None, hidden_size: int | None = None) -> "SemanticProbe":
        """Load a probe; with ``model``/``hidden_size`` given, refuse one trained for another model."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"probe not found: {path} (train a pair with `semverify probes`)")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ProbeError(f"{path} is not a readable semverify probe ({type(err).__name__}: {err})") from err
        if hidden_size is not None and blob["hidden_size"] != hidden_size:
            raise ProbeError(f"probe {path} was trained for {blob['model']} (hidden size {blob['hidden_size']}); "
                             f"this model has hidden size {hidden_size}")
        if model is not None and blob["model"] and Path(str(model)).name != Path(str(blob["model"])).name:
            raise ProbeError(f"probe {path} was trained for {blob['model']}, not {model}")
        probe = cls(blob["hidden_size"], blob["width"], blob["model"], blob["meta"])
        probe.load_state_dict(blob["state"])
        probe.source = str(path)
        return probe.eval()
