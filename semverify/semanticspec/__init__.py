"""SemanticSpec and step-level verification: the draft writes whole reasoning steps and a step rule
accepts or rejects each one (probes on hidden states, the target's likelihood, or the target as judge)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from ..methods import Method, register_method
from ..model_cache import cache_root, model_key
from ..registry import DrafterKind, DraftResources, RunContext, register_drafter, register_rule
from .baselines import SpecReason, StepLikelihood
from .drafter import StepDrafter
from .drafts import StepDraft, StepTokensDraft
from .probe import ProbeError, SemanticProbe
from .rule import SemanticStepRule
from .segment import DEFAULT_STOPS, StepSegmenter
from .steps import StepRule, token_veto

SHIPPED_PROBES = Path(__file__).parent / "probes"


def pair_key(draft_model: str | os.PathLike, target_model: str | os.PathLike) -> str:
    """The folder name of a draft/target pair's probes: ``<draft>__<target>`` (model keys)."""
    return f"{model_key(draft_model)}__{model_key(target_model)}"


def find_probes(draft_model: str | os.PathLike, target_model: str | os.PathLike) -> tuple[SemanticProbe, SemanticProbe]:
    """The (draft, target) probes trained for a pair: in the user's cache first, then among the shipped ones."""
    key = pair_key(draft_model, target_model)
    for root in (cache_root() / "probes", SHIPPED_PROBES):
        if (root / key / "draft.pt").is_file() and (root / key / "target.pt").is_file():
            return (SemanticProbe.load(root / key / "draft.pt", model=str(draft_model)),
                    SemanticProbe.load(root / key / "target.pt", model=str(target_model)))
    raise FileNotFoundError(f"no semantic probes for the pair {draft_model} -> {target_model}; train them with "
                            f"`semverify probes --draft {draft_model} --target {target_model}` or pass draft_probe= "
                            "and target_probe= files")


def make_semanticspec(context: RunContext, draft_probe: str | SemanticProbe | None = None,
                      target_probe: str | SemanticProbe | None = None, r_min: float = 0.5, **veto) -> SemanticStepRule:
    """The ``semanticspec`` rule; probes are objects or ``.pt`` paths, or found by the run's model names."""
    if draft_probe is None or target_probe is None:
        if context.draft_model is None or context.target_model is None:
            missing = "draft" if draft_probe is None else "target"
            raise ValueError(f"semanticspec needs a {missing} probe: {missing}_probe=PATH, or a run that names both "
                             "models (their probes are found by name)")
        found = find_probes(context.draft_model, context.target_model)
        draft_probe, target_probe = draft_probe or found[0], target_probe or found[1]
    load = lambda probe: probe if isinstance(probe, SemanticProbe) else SemanticProbe.load(probe)  # noqa: E731
    return SemanticStepRule(load(draft_probe), load(target_probe), r_min=r_min, **veto)


def _step_drafter(resources: DraftResources, k: int, int8: bool = False, rounds: int = 16) -> StepDrafter:
    if resources.tokenizer is None:
        raise ValueError("steps end at text breaks: the step drafter needs the tokenizer (tokenizer= in generate())")
    return StepDrafter(resources.draft_model_int8 if int8 else resources.draft_model,
                       StepSegmenter(resources.tokenizer, max_step_tokens=k), eos_token_id=resources.eos_token_id,
                       rounds=int(rounds))


register_rule("semanticspec", make_semanticspec, contextual=True)
register_rule("step_likelihood", StepLikelihood)
register_rule("specreason", lambda context, **params: SpecReason(context.tokenizer, **params), contextual=True,
              takes=functools.partial(SpecReason, None))
register_drafter(DrafterKind("step", _step_drafter, StepDrafter, needs=("draft_model",), settings=("rounds",),
                             default_k=128, step_cap=True))
# the same steps written by the int8 draft: where drafting, not verification, bounds a step rule's speed
register_drafter(DrafterKind("step_int8", lambda resources, k, **kw: _step_drafter(resources, k, True, **kw),
                             StepDrafter, needs=("draft_model_int8",), settings=("rounds",), default_k=128,
                             step_cap=True))
# whole steps of up to k tokens; probes found by the models' names
register_method(Method("semanticspec", "step", "semanticspec", {"r_min": 0.5}, k=128))
register_method(Method("step_likelihood", "step", "step_likelihood", {"min_mean_logprob": -0.5}, k=128))
register_method(Method("specreason", "step", "specreason", {"threshold": 7.0}, k=128))
# SemanticSpec with its steps written by the int8 draft (where drafting bounds a step rule's speed)
register_method(Method("semanticspec_int8", "step_int8", "semanticspec", {"r_min": 0.5}, k=128))

__all__ = ["DEFAULT_STOPS", "ProbeError", "SemanticProbe", "SemanticStepRule", "SpecReason", "StepDraft", "StepDrafter",
           "StepLikelihood", "StepRule", "StepSegmenter", "StepTokensDraft", "find_probes", "make_semanticspec",
           "pair_key", "token_veto"]
