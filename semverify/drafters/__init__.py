"""Drafters propose tokens for the target to verify: a small model, prompt lookup, or none."""

from .base import BaseDrafter, Drafter, NoDrafter
from .model import ModelDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["BaseDrafter", "Drafter", "NoDrafter", "ModelDrafter", "PromptLookupDrafter"]
