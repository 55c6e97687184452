"""Splitting a batch's verification by draft length: the cheapest grouping under the position cost model."""

from semverify.engine.width_groups import width_groups


def test_one_long_draft_is_verified_apart_from_the_short_ones():
    assert width_groups([3, 40, 2, 128, 35], unseen=1, overhead=32) == [[2, 0], [4, 1], [3]]
    assert width_groups([3, 40, 2, 128, 35], unseen=1, overhead=32, most=2) == [[2, 0, 4, 1], [3]]


def test_one_forward_when_splitting_saves_less_than_a_forward_costs():
    assert width_groups([5, 5, 5, 5], unseen=1) is None  # nothing padded
    assert width_groups([4, 6, 5], unseen=1, overhead=32) is None  # 4 padded positions < 32
    assert width_groups([4, 6], unseen=1, overhead=0) == [[0], [1]]
    assert width_groups([7], unseen=3, overhead=0) is None
