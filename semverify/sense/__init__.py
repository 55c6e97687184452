"""SENSE: retrieval drafting on the target's hidden states, loose-trie tree drafts, soft-gated evaluation."""

import inspect

from ..registry import DrafterKind, DraftResources, Method, register_drafter, register_method, register_rule
from .build import build_datastore, collect_states, describe, timed_build
from .datastore import Datastore, DatastoreError
from .drafter import RetrievalDrafter
from .gate import DeferredWindow, SoftGate, isolated_mismatch

# retrieval drafter kinds -> RetrievalDrafter switches (REST: exact suffix; DReSD: hidden states; SEN: both)
RETRIEVAL = {"rest": {"semantic": False}, "dresd": {"lexical": False}, "sen": {}}


def _retrieval_kind(name: str, switches: dict) -> DrafterKind:
    settings = tuple(p for p in inspect.signature(RetrievalDrafter).parameters if p not in ("datastore", *switches))

    def factory(resources: DraftResources, k: int, **params) -> RetrievalDrafter:
        return RetrievalDrafter(resources.datastore, **switches, **params)

    return DrafterKind(name, factory, settings=(*settings, "datastore"), default_k=8, retrieval=True, batches=False)


register_rule("sense", SoftGate)
register_rule("fly", DeferredWindow)
for _name, _switches in RETRIEVAL.items():
    register_drafter(_retrieval_kind(_name, _switches))
# SENSE and its ablations on one datastore (--datastore): retrieval drafts 8 deep, greedy verification
for _preset in (
    Method("rest", "rest", "greedy", k=8),
    Method("dresd", "dresd", "greedy", k=8),
    Method("sense", "sen", "sense", k=8),
    Method("sense_no_sen", "rest", "sense", k=8),
    Method("sense_no_se", "sen", "greedy", k=8),
    Method("fly", "rest", "fly", k=8),
):
    register_method(_preset)

__all__ = ["RETRIEVAL", "Datastore", "DatastoreError", "DeferredWindow", "RetrievalDrafter", "SoftGate",
           "build_datastore", "collect_states", "describe", "isolated_mismatch", "timed_build"]
