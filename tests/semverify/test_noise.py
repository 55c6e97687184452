"""The noise type: one module tells a stream, one per row and coupled noise apart, and the kinds of draft."""

import pytest
import torch

from semverify.engine.coupling import CoupledNoise, CoupledRows
from semverify.engine.noise import call_noise, drafting, is_coupled, joined, per_row, rows_of, sample_from, uniform
from semverify.types import Draft


def test_per_row_and_joined_are_inverse_for_every_kind():
    g = torch.Generator().manual_seed(0)
    assert per_row(g, 3) == [g, g, g] and joined([g]) is g
    streams = [torch.Generator().manual_seed(i) for i in range(3)]
    assert per_row(streams, 3) == streams and joined(streams) == streams
    coupled = [CoupledNoise(7).row(i) for i in range(3)]
    rows = joined(coupled)
    assert isinstance(rows, CoupledRows) and per_row(rows, 3) == coupled and is_coupled(rows)
    assert rows_of(rows, [2]) is coupled[2] and rows_of(streams, [0, 2]) == [streams[0], streams[2]]
    with pytest.raises(ValueError, match="2 entries .* batch of 3"):
        per_row(streams[:2], 3)


def test_a_call_gives_each_row_its_own_noise():
    assert len(call_noise(None, 3)) == 3
    one = CoupledNoise(5)
    assert call_noise(one, 1) is one
    assert [n.seed for n in call_noise(one, 2)] == [one.row(0).seed, one.row(1).seed]
    with pytest.raises(ValueError, match="one generator per row"):
        call_noise([None], 2)


def test_draws_follow_the_kind_of_noise():
    probs = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sample_from(probs, torch.Generator().manual_seed(1)).tolist() == [1, 0]
    assert sample_from(probs, [torch.Generator(), torch.Generator()]).tolist() == [1, 0]
    assert sample_from(probs, CoupledRows([CoupledNoise(1), CoupledNoise(2)]), positions=0).tolist() == [1, 0]
    with pytest.raises(ValueError, match="positions"):
        sample_from(probs, CoupledNoise(1))
    assert uniform((2, 3), [torch.Generator().manual_seed(4)] * 2).shape == (2, 3)
    g = torch.Generator()
    assert drafting(g) is g and drafting(CoupledNoise(3))._draft


def test_the_kind_of_a_draft():
    tokens = torch.zeros(2, 3, dtype=torch.long)
    assert Draft(tokens).kind == "chain" and Draft(tokens).row_lengths() == [3, 3]
    ragged = Draft(tokens, lengths=torch.tensor([1, 3]))
    assert ragged.kind == "chains" and ragged.row_lengths() == [1, 3]
    assert ragged.mask().tolist() == [[True, False, False], [True, True, True]]
    assert Draft(tokens[:1], parents=torch.tensor([-1, 0, 0])).kind == "tree"
    rows = Draft(tokens, lengths=torch.tensor([3, 3]), rows=[Draft(tokens[:1]), Draft(tokens[1:])])
    assert rows.kind == "rows"
