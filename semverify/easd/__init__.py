"""EASD: entropy-aware speculative decoding (rule ``easd``), with entropy calibration by percentile."""

from __future__ import annotations


from ..rules import register_rule
from .calibration import EntropyCalibration, calibrate_entropy, calibration_path, find_calibration
from .rule import EntropyAwareRule


DEFAULT_PERCENTILE = 80  # the authors' starting point (ALGORITHMS.md section 1); the built-in `easd` method too


def make_easd(
    tau_q: float | None = None,
    tau_p: float | None = None,
    percentile: float | None = None,
    draft_calibration: str | None = None,
    target_calibration: str | None = None,
    temperature: float = 1.0,
    top_n: int = 5,
    overlap: float = 0.6,
    resample: str = "target",
    normalize: bool = False,
) -> EntropyAwareRule:
    """The ``easd`` rule from raw thresholds (nats), or from a percentile of each model's calibration.

    ``draft_calibration``/``target_calibration``: a model name (looked up as in
    :func:`find_calibration`) or a calibration JSON path. ``temperature`` picks the calibration made
    at the decoding temperature (greedy decoding sees the T=1 distributions). With no thresholds at all
    but both calibrations known (``generate(acceptance="easd")`` names the models), the percentile is
    the calibrated default, ``DEFAULT_PERCENTILE``.
    """
    if percentile is tau_q is tau_p is None and draft_calibration and target_calibration:
        percentile = DEFAULT_PERCENTILE
    if percentile is not None:
        if tau_q is not None or tau_p is not None:
            raise ValueError("easd: give either percentile or tau_q/tau_p, not both")
        if draft_calibration is None or target_calibration is None:
            raise ValueError("easd: percentile needs draft_calibration and target_calibration "
                             "(model names or calibration JSON files)")
        tau_q = find_calibration(draft_calibration).threshold(percentile, temperature, normalize)
        tau_p = find_calibration(target_calibration).threshold(percentile, temperature, normalize)
    elif tau_q is None or tau_p is None:
        raise ValueError("easd needs thresholds: tau_q and tau_p in nats, or percentile with "
                         "draft_calibration and target_calibration")
    return EntropyAwareRule(tau_q, tau_p, top_n=top_n, overlap=overlap, resample=resample, normalize=normalize)


register_rule("easd", make_easd)

__all__ = ["EntropyAwareRule", "EntropyCalibration", "calibrate_entropy", "calibration_path", "find_calibration",
           "make_easd"]
