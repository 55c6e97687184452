"""SemanticSpec: the draft writes whole reasoning steps; probes on hidden states estimate the probability
of each step's meaning under both models, and a ratio test accepts or rejects the step."""

from __future__ import annotations

import os
from pathlib import Path

from ..models import per_model_file
from ..rules import register_rule
from .drafter import StepDrafter
from .probe import ProbeError, SemanticProbe
from .rule import SemanticStepRule
from .segment import DEFAULT_STOPS, StepSegmenter

SHIPPED_PROBES = Path(__file__).parent / "probes"


def find_probe(name_or_path: str | os.PathLike) -> SemanticProbe:
    """A probe from a ``.pt`` path, or by model name: the user's cache first, then the shipped probes."""
    if str(name_or_path).endswith(".pt"):
        return SemanticProbe.load(name_or_path)
    found = per_model_file(name_or_path, "probes", ".pt", SHIPPED_PROBES)
    if found is not None:
        return SemanticProbe.load(found, model=str(name_or_path))
    raise FileNotFoundError(f"no semantic probe for {name_or_path!r}; train one with `semverify probes --model "
                            f"{name_or_path}` or pass a probe file")


def make_semanticspec(draft_probe: str | SemanticProbe | None = None, target_probe: str | SemanticProbe | None = None,
                      r_min: float = 0.5, draft_model: str | None = None,
                      target_model: str | None = None) -> SemanticStepRule:
    """The ``semanticspec`` rule; probes are objects, ``.pt`` paths, or found by the models' names."""
    probes = []
    for probe, model, role in ((draft_probe, draft_model, "draft"), (target_probe, target_model, "target")):
        source = probe if probe is not None else model
        if source is None:
            raise ValueError(f"semanticspec needs a {role} probe: {role}_probe=PATH or {role}_model=NAME")
        probes.append(source if isinstance(source, SemanticProbe) else find_probe(source))
    return SemanticStepRule(probes[0], probes[1], r_min=r_min)


register_rule("semanticspec", make_semanticspec)

__all__ = ["DEFAULT_STOPS", "ProbeError", "SemanticProbe", "SemanticStepRule", "StepDrafter", "StepSegmenter",
           "find_probe", "make_semanticspec"]
