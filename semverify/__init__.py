"""semverify: one speculative decoding loop with pluggable drafters and acceptance rules."""

from . import easd, semanticspec, sense  # noqa: F401  (importing registers their rules)
from .drafters import Drafter, ModelDrafter, NoDrafter, PromptLookupDrafter
from .generation import SpecGenerateOutput, generate
from .loop import speculative_generate
from .models import DEFAULT_DRAFT, DEFAULT_TARGET, OFFLINE_MODELS, load_model
from .rules import (
    AcceptanceRule,
    GreedyMatch,
    SpeculativeSampling,
    TypicalAcceptance,
    available_rules,
    get_rule,
    register_rule,
)
from .sampling import Sampler
from .stats import SpecStats
from .types import Draft, Verdict, VerifyInput

__version__ = "0.1.0"

__all__ = [
    "AcceptanceRule", "DEFAULT_DRAFT", "DEFAULT_TARGET", "Draft", "Drafter", "GreedyMatch", "ModelDrafter",
    "NoDrafter", "OFFLINE_MODELS", "PromptLookupDrafter", "Sampler", "SpecGenerateOutput", "SpecStats",
    "SpeculativeSampling", "TypicalAcceptance", "Verdict", "VerifyInput", "available_rules", "generate",
    "get_rule", "load_model", "register_rule", "speculative_generate",
]
