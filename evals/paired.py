"""Paired comparisons of a method against a reference on the same problems: the accuracy difference with
a 95% bootstrap interval over problems (their samples nested) and an anytime-valid one for runs read as they
grow, how small a difference the run can detect, how many problems a given difference would need, and where
the outputs diverge."""

from __future__ import annotations

import math
import random
import statistics

Z_95, Z_POWER_80 = 1.959964, 0.841621  # two-sided 5% test, 80% power


def by_problem(keys: list[tuple[int, int]], grades: list[bool]) -> dict[int, list[bool]]:
    """Each problem's grades, in sample order, from grades aligned with the (problem, sample) ``keys``."""
    out: dict[int, list[bool]] = {}
    for (pid, _), grade in zip(keys, grades):
        out.setdefault(pid, []).append(grade)
    return out


def pass_rates(grades: dict[int, list[bool]]) -> dict[int, float]:
    """Each problem's share of correct samples."""
    return {pid: sum(g) / len(g) for pid, g in grades.items()}


def accuracy_difference(method: dict[int, list[bool]], reference: dict[int, list[bool]], resamples: int = 4000,
                        seed: int = 0) -> dict:
    """Mean over problems of (method's pass rate - reference's), with a 95% percentile interval from a
    two-stage paired bootstrap: problems are resampled, then each drawn problem's samples (the same sample
    indices for both, so coupled samples stay paired). ``per_problem``: the differences in problem-id order,
    the order a run decodes them in."""
    pids = sorted(set(method) & set(reference))
    if not pids:
        raise ValueError("no problem has rows for both methods")
    rates, reference_rates = pass_rates(method), pass_rates(reference)
    diffs = [rates[p] - reference_rates[p] for p in pids]
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        total = 0.0
        for p in rng.choices(pids, k=len(pids)):
            m, r = method[p], reference[p]
            picks = [rng.randrange(len(m)) for _ in m] if len(m) > 1 else [0]
            total += sum(m[i] - r[i] for i in picks) / len(picks)
        draws.append(total / len(pids))
    draws.sort()
    lo, hi = draws[int(0.025 * resamples)], draws[min(int(0.975 * resamples), resamples - 1)]
    sd = statistics.pstdev(diffs) if len(diffs) > 1 else 0.0
    anytime_low, anytime_high = confidence_sequence(diffs)
    return {"difference": sum(diffs) / len(diffs), "low": lo, "high": hi, "problems": len(pids),
            "anytime_low": anytime_low, "anytime_high": anytime_high, "per_problem": diffs,
            "discordant": sum(d != 0 for d in diffs), "sd": sd,
            "detectable": detectable_difference(sd, len(pids))}


def interval_points(low: float, high: float, scale: float = 100.0) -> str:
    """An interval as the tables and docs write it, in points with one decimal: '[-0.2, +17.4]'."""
    return f"[{scale * low:+.1f}, {scale * high:+.1f}]"


def as_points(difference: float, low: float, high: float, scale: float = 100.0) -> str:
    """A difference with its interval, in points: '+6.2 [+0.7, +11.6]' (``scale=1`` for values already in points)."""
    return f"{scale * difference:+.1f} {interval_points(low, high, scale)}"


def confidence_sequence(diffs: list[float], alpha: float = 0.05, cap: float = 0.5) -> tuple[float, float]:
    """An interval for the mean of ``diffs`` (each in [-1, 1], in the order the problems ran) that holds with
    probability 1 - ``alpha`` at every prefix at once, so a run read after each batch may stop whenever its
    reader likes: the predictable plug-in empirical-Bernstein confidence sequence of Waudby-Smith & Ramdas
    (2023, "Estimating means of bounded random variables by betting", Theorem 2), its bounds intersected
    over prefixes. Wider than the fixed-n interval (1.7x at 480 problems): the price of peeking."""
    return confidence_path(diffs, alpha, cap)[-1]


def confidence_path(diffs: list[float], alpha: float = 0.05, cap: float = 0.5) -> list[tuple[float, float]]:
    """The confidence sequence's bounds after each problem (see ``confidence_sequence``)."""
    if not diffs:
        raise ValueError("no differences")
    if any(not -1 <= d <= 1 for d in diffs):
        raise ValueError("differences must lie in [-1, 1]")
    log_term = math.log(2 / alpha)
    mean, variance = 0.5, 0.25  # the running estimates before any data: [0, 1]'s centre and largest variance
    total, squares = 0.0, 0.0
    bets = weighted = penalty = 0.0
    low, high = -1.0, 1.0
    path = []
    for t, d in enumerate(diffs, start=1):
        x = (d + 1) / 2  # onto [0, 1]
        bet = min(math.sqrt(2 * log_term / (variance * t * math.log(1 + t))), cap)
        penalty += (x - mean) ** 2 * (-math.log(1 - bet) - bet)  # v_t psi_E(bet): 4 (x - mean)^2 (...) / 4
        bets += bet
        weighted += bet * x
        total += x
        mean = (0.5 + total) / (t + 1)
        squares += (x - mean) ** 2
        variance = (0.25 + squares) / (t + 1)
        centre, width = weighted / bets, (log_term + penalty) / bets
        low, high = max(low, 2 * (centre - width) - 1), min(high, 2 * (centre + width) - 1)
        path.append((low, high))
    return path


def holm_adjusted(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjustment: each p made comparable with the family-wise level, so a method chosen as
    the best of several still has to clear 5% after its rivals are counted."""
    ranked = sorted(p_values, key=p_values.get)
    adjusted, running = {}, 0.0
    for i, name in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - i) * p_values[name]))
        adjusted[name] = running
    return adjusted


def normal_path(diffs: list[float]) -> list[tuple[float, float]]:
    """The running mean of ``diffs`` after each problem and the half-width of the fixed-n normal 95% interval a
    reader would compute there: what peeking at a fixed-n interval shows."""
    path, total, squares = [], 0.0, 0.0
    for t, d in enumerate(diffs, start=1):
        total, squares = total + d, squares + d * d
        mean = total / t
        path.append((mean, Z_95 * math.sqrt(max(squares / t - mean * mean, 0.0) / t)))
    return path


def detectable_difference(sd: float, problems: int) -> float:
    """The smallest true difference a paired test on ``problems`` problems finds 80% of the time at the 5%
    level, given the per-problem differences' standard deviation ``sd`` (its observed discordance)."""
    return (Z_95 + Z_POWER_80) * sd / math.sqrt(problems) if problems else math.inf


def problems_needed(difference: float, sd: float) -> int:
    """Problems a paired comparison needs to detect ``difference`` (80% power, 5% level) at spread ``sd``."""
    return math.ceil(((Z_95 + Z_POWER_80) * sd / difference) ** 2) if difference else 0


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first token position where two outputs differ (None when they are identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence_position(row: dict, reference: dict) -> int | None:
    """The first token where two differing outputs part; None when the rows predate token ids."""
    if "output_ids" not in row or "output_ids" not in reference:
        return None
    return first_divergence(row["output_ids"], reference["output_ids"])


def divergence(rows: list[dict], reference_rows: list[dict], grader: str) -> dict:
    """How a method's outputs relate to the reference's on the same (problem, sample): how many are token
    for token equal, the median first diverging position (over rows that hold token ids), and how many
    diverged outputs changed outcome."""
    positions, flips, equal = [], 0, 0
    for r, ref in zip(rows, reference_rows):
        if r["output"] == ref["output"] and r.get("output_ids") == ref.get("output_ids"):
            equal += 1
            continue
        at = divergence_position(r, ref)
        if at is not None:
            positions.append(at)
        flips += r["grades"][grader] != ref["grades"][grader]
    return {"identical": equal, "outputs": len(rows), "median_first_divergence":
            statistics.median(positions) if positions else None, "flips": flips}
