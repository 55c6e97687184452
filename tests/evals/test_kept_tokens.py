"""Ranks of kept tokens in the target's distribution."""

import torch

from evals.kept_tokens import ranks_of


def test_ranks_count_the_tokens_more_likely_and_ties_take_the_better_rank():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.4, 0.4, 0.2]])
    ranks, chosen = ranks_of(p, torch.tensor([0, 2, 1]))
    assert ranks.tolist() == [1, 2, 1] and torch.allclose(chosen, torch.tensor([0.5, 0.3, 0.4]))
