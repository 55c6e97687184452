"""Paired intervals and divergence: a known difference is covered, identical methods give exactly zero."""

import math

from evals.paired import accuracy_difference, detectable_difference, divergence, first_divergence, problems_needed


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
