"""SENSE: retrieval drafting on the target's hidden states, loose-trie tree drafts, soft-gated evaluation."""

from ..rules import register_rule
from .gate import DeferredWindow, SoftGate, isolated_mismatch

register_rule("sense", SoftGate)
register_rule("fly", DeferredWindow)

__all__ = ["DeferredWindow", "SoftGate", "isolated_mismatch"]
