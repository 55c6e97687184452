"""Paired intervals and divergence: a known difference is covered, identical methods give exactly zero."""

import math
import random

import pytest

from evals.paired import (
    accuracy_difference,
    as_points,
    confidence_sequence,
    detectable_difference,
    divergence,
    first_divergence,
    holm_adjusted,
    interval_points,
    problems_needed,
)


def test_identical_grades_give_a_zero_difference_and_interval():
    grades = {p: [p % 3 == 0, p % 2 == 0] for p in range(40)}
    d = accuracy_difference(grades, grades)
    assert d["difference"] == d["low"] == d["high"] == 0 and d["discordant"] == 0 and d["detectable"] == 0


def test_the_interval_covers_the_difference_and_shrinks_with_problems():
    def run(n):  # the method solves every 5th problem the reference misses: +10 points on average
        ref = {p: [p % 2 == 0] for p in range(n)}
        method = {p: [p % 2 == 0 or p % 10 == 1] for p in range(n)}
        return accuracy_difference(method, ref, resamples=2000)

    small, big = run(100), run(1000)
    for d in (small, big):
        assert math.isclose(d["difference"], 0.1) and d["low"] < 0.1 < d["high"] and d["low"] > 0
    assert big["high"] - big["low"] < 0.5 * (small["high"] - small["low"])
    assert big["detectable"] < small["detectable"]


def test_samples_are_nested_within_problems():
    ref = {p: [True, False] for p in range(50)}
    method = {p: [True, True] for p in range(50)}
    d = accuracy_difference(method, ref, resamples=500)
    assert math.isclose(d["difference"], 0.5) and d["low"] < 0.5 < d["high"]


def test_sizes_and_divergence():
    assert math.isclose(detectable_difference(0.3, 100), (1.959964 + 0.841621) * 0.03)
    assert problems_needed(0.02, 0.3) == math.ceil(((1.959964 + 0.841621) * 0.3 / 0.02) ** 2)
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None and first_divergence([1, 2], [1, 5]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    rows = [{"output": "a", "output_ids": [1, 2], "grades": {"g": True}},
            {"output": "b", "output_ids": [1, 3, 4], "grades": {"g": False}}]
    ref = [{"output": "a", "output_ids": [1, 2], "grades": {"g": True}},
           {"output": "c", "output_ids": [1, 2, 4], "grades": {"g": True}}]
    assert divergence(rows, ref, "g") == {"identical": 1, "outputs": 2, "median_first_divergence": 1, "flips": 1}


def test_rows_without_token_ids_have_no_divergence_position():
    from evals.margins import lossless_differences

    rows = [{"output": "b", "grades": {"g": True}}]
    ref = [{"output": "a", "grades": {"g": True}}]
    assert divergence(rows, ref, "g") == {"identical": 0, "outputs": 1, "median_first_divergence": None, "flips": 0}
    assert lossless_differences(rows, ref, [(4, 0)]) == [{"id": 4, "sample": 0, "position": None}]


def _ternary_runs(reps: int, n: int, up: float, down: float, seed: int = 1) -> list[list[int]]:
    """Paired differences of 0/1 grades: +1 with probability ``up``, -1 with ``down``, else 0."""
    rng = random.Random(seed)
    return [[1 if (u := rng.random()) < up else -1 if u < up + down else 0 for _ in range(n)] for _ in range(reps)]


def test_the_confidence_sequence_holds_at_every_look_where_a_fixed_n_interval_read_each_batch_does_not():
    truth, runs = 0.1, _ternary_runs(200, 480, up=0.2, down=0.1)
    cs_misses = peek_misses = 0
    for d in runs:
        low, high = confidence_sequence(d)  # intersected over prefixes: a miss at any look is a miss here
        cs_misses += not low <= truth <= high
        missed = False
        for t in range(32, len(d) + 1, 32):  # a reader who looks after every batch of 32 with a normal interval
            m = sum(d[:t]) / t
            half = 1.959964 * math.sqrt(sum((x - m) ** 2 for x in d[:t]) / t / t)
            missed |= not m - half <= truth <= m + half
        peek_misses += missed
    assert cs_misses / len(runs) <= 0.05
    assert peek_misses / len(runs) > 0.1  # peeking breaks the fixed-n interval: why the sequence exists


def test_the_confidence_sequence_narrows_with_problems_and_is_wider_than_the_fixed_n_interval():
    widths = []
    for n in (100, 1000):
        d = _ternary_runs(1, n, up=0.2, down=0.1, seed=n)[0]
        low, high = confidence_sequence(d)
        assert low < sum(d) / n < high
        widths.append(high - low)
        assert high - low > 2 * 1.959964 * math.sqrt(0.29 / n)
    assert widths[1] < 0.5 * widths[0]
    assert confidence_sequence([0] * 300)[0] < 0 < confidence_sequence([0] * 300)[1]
    assert accuracy_difference({0: [True]}, {0: [False]})["anytime_high"] <= 1
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        confidence_sequence([2.0])


def test_holm_multiplies_the_smallest_p_by_the_family_size_and_keeps_the_order():
    adjusted = holm_adjusted({"a": 0.017, "b": 0.83, "c": 0.01, "d": 0.5})
    assert math.isclose(adjusted["c"], 0.04) and math.isclose(adjusted["a"], 0.051)
    assert math.isclose(adjusted["d"], 1.0) and adjusted["b"] == 1.0
    assert holm_adjusted({"only": 0.03}) == {"only": 0.03}


def test_intervals_are_written_in_signed_points_with_one_decimal():
    assert as_points(0.062, 0.007, 0.1161) == "+6.2 [+0.7, +11.6]"
    assert as_points(-3.1, -8.3, 2.0, scale=1) == "-3.1 [-8.3, +2.0]"
    assert interval_points(-0.002, 0.174) == "[-0.2, +17.4]"
