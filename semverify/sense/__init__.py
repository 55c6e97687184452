"""SENSE: retrieval drafting on the target's hidden states, loose-trie tree drafts, soft-gated evaluation."""

from ..rules import register_rule
from ..answers import generate_answers
from .datastore import Datastore, DatastoreError, build_datastore, collect_states, describe, timed_build
from .drafter import RetrievalDrafter
from .gate import DeferredWindow, SoftGate, isolated_mismatch

register_rule("sense", SoftGate)
register_rule("fly", DeferredWindow)

__all__ = ["Datastore", "DatastoreError", "DeferredWindow", "RetrievalDrafter", "SoftGate", "build_datastore",
           "collect_states", "describe", "generate_answers", "isolated_mismatch", "timed_build"]
