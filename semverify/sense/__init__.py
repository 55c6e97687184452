"""SENSE: retrieval drafting on the target's hidden states, loose-trie tree drafts, soft-gated evaluation."""

import inspect

from ..easd.calibration import find_calibration
from ..methods import Method, register_method
from ..registry import DrafterKind, DraftResources, RunContext, register_drafter, register_rule
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

    return DrafterKind(name, factory, RetrievalDrafter, settings=(*settings, "datastore"), default_k=8, retrieval=True)


def make_sense(context: RunContext, theta_e: float | None = None, percentile: float | None = None,
               top_k: int = 3, window: int = 6, target_calibration: str | None = None) -> SoftGate:
    """SENSE's soft gate; ``theta_e`` as a normalised entropy (the paper's 0.05 by default), or as a
    ``percentile`` of the target's own entropy (its EASD calibration, found by the run's target name or
    given as ``target_calibration``), since 0.05 is a different share of positions for every model."""
    if percentile is not None:
        if theta_e is not None:
            raise ValueError("sense: give theta_e or percentile, not both")
        source = target_calibration or context.target_model
        if source is None:
            raise ValueError("sense: a percentile needs the target's entropy calibration (a run that names the "
                             "target, or target_calibration=FILE)")
        calibration = find_calibration(source)
        gate = SoftGate(calibration.threshold(percentile, context.temperature, normalize=True), top_k, window)
        return gate.built_from(calibration.source)
    return SoftGate(0.05 if theta_e is None else theta_e, top_k, window)


register_rule("sense", make_sense, contextual=True)
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
