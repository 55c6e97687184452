"""EASD: entropy-aware speculative decoding (rule ``easd``), with entropy calibration by percentile."""

from __future__ import annotations

from ..methods import Method, register_method
from ..registry import RunContext, register_rule
from .calibration import EntropyCalibration, calibration_path, find_calibration
from .rule import EntropyAwareRule

DEFAULT_PERCENTILE = 80  # the authors' starting point (the paper's 80th percentile); the built-in `easd` method too


def make_easd(
    context: RunContext,
    draft_entropy: float | None = None,
    target_entropy: float | None = None,
    percentile: float | None = None,
    draft_calibration: str | None = None,
    target_calibration: str | None = None,
    normalize: bool = False,
    **options,
) -> EntropyAwareRule:
    """The ``easd`` rule from raw entropy thresholds (nats), or from a percentile of each model's calibration.

    Calibrations are found by the run's model names (``context``), or given as JSON files
    (``draft_calibration``/``target_calibration``); the run's temperature picks the calibration made at
    it (greedy decoding sees the T=1 distributions). With no thresholds at all, the percentile is
    ``DEFAULT_PERCENTILE``. ``options`` go to `EntropyAwareRule` (``top_n``, ``overlap``,
    ``resample``, and the paper's ablations ``use_entropy=False`` / ``use_overlap=False``).
    """
    artifacts: tuple[str, ...] = ()
    if draft_entropy is None and target_entropy is None:
        sources = (draft_calibration or context.draft_model, target_calibration or context.target_model)
        if None in sources:
            raise ValueError("easd needs thresholds: draft_entropy and target_entropy in nats, or a percentile of "
                             "calibrations found by the run's model names or given as draft_calibration and "
                             "target_calibration files")
        calibrations = [find_calibration(s) for s in sources]
        percentile = DEFAULT_PERCENTILE if percentile is None else percentile
        draft_entropy, target_entropy = (c.threshold(percentile, context.temperature, normalize) for c in calibrations)
        artifacts = tuple(c.source for c in calibrations)
    elif percentile is not None:
        raise ValueError("easd: give either percentile or draft_entropy/target_entropy, not both")
    elif draft_entropy is None or target_entropy is None:
        raise ValueError("easd needs thresholds for both models: draft_entropy and target_entropy (nats), or neither "
                         "(a percentile)")
    rule = EntropyAwareRule(draft_entropy, target_entropy, normalize=normalize, **options)
    return rule.built_from(*artifacts)  # the calibration files it was built from (runs pin them by content)


register_rule("easd", make_easd, contextual=True)
register_method(Method("easd", "model", "easd", {"percentile": 80}))

__all__ = ["EntropyAwareRule", "EntropyCalibration", "calibration_path", "find_calibration", "make_easd"]
