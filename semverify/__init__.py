"""semverify: one speculative decoding loop with pluggable drafters and acceptance rules."""

from . import easd, relaxed, semanticspec, sense  # noqa: E402,F401  (importing registers their rules, drafters and methods)
from .drafters import (
    BaseDrafter,
    Drafter,
    HybridDrafter,
    ModelDrafter,
    ModelTreeDrafter,
    NoDrafter,
    PromptLookupDrafter,
)
from .engine.coupling import CoupledNoise
from .engine.loop import speculative_generate
from .engine.sampling import Sampler
from .generation import SpecGenerateOutput, generate
from .methods import Method, available_methods, register_method
from .models import DEFAULT_DRAFT, DEFAULT_TARGET, OFFLINE_MODELS, load_model
from .plugins import load_plugins
from .registry import (
    DrafterKind,
    DraftResources,
    RunContext,
    available_drafters,
    available_rules,
    get_rule,
    make_drafter,
    register_drafter,
    register_rule,
)
from .rules import BaseRule, GreedyMatch, SpeculativeSampling, TypicalAcceptance
from .semanticspec.drafts import StepDraft, StepTokensDraft
from .stats import SpecStats
from .types import Draft, StepOutcome, TokenLaw, Verdict, VerifyInput

__version__ = "0.2.0"

__all__ = [
    "BaseDrafter", "BaseRule", "CoupledNoise", "DEFAULT_DRAFT", "DEFAULT_TARGET", "Draft",
    "DraftResources", "Drafter",
    "DrafterKind", "GreedyMatch", "HybridDrafter", "Method", "ModelDrafter", "ModelTreeDrafter", "NoDrafter",
    "OFFLINE_MODELS", "PromptLookupDrafter",
    "RunContext", "Sampler", "SpecGenerateOutput", "SpecStats", "SpeculativeSampling", "StepDraft", "StepOutcome",
    "StepTokensDraft", "TokenLaw", "TypicalAcceptance", "Verdict", "VerifyInput", "available_drafters",
    "available_methods",
    "available_rules", "generate", "get_rule", "load_model", "load_plugins", "make_drafter", "register_drafter",
    "register_method", "register_rule", "speculative_generate",
]


def __getattr__(name: str):
    """Deprecated names, kept for one release (``AcceptanceRule``: use `BaseRule`)."""
    if name == "AcceptanceRule":
        from . import rules

        return getattr(rules, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
