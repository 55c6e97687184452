"""Drafters propose tokens for the target to verify: a small model (chains or trees), prompt lookup, both, or none."""

from .base import BaseDrafter, Drafter, NoDrafter
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .model_tree import ModelTreeDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["BaseDrafter", "Drafter", "HybridDrafter", "NoDrafter", "ModelDrafter", "ModelTreeDrafter",
           "PromptLookupDrafter"]
