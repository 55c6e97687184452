"""Forward-cost benchmark and the replay's speedup forecast built on it."""

from __future__ import annotations

import json

import pytest
import torch

from evals.replay import add_predicted_speedup, replay_table
from semverify.cost import cost_at, forward_seconds
from tests.helpers import tiny_model


def test_cost_is_interpolated_between_measured_sizes():
    costs = {"0": 1.0, "8": 1.2, "16": 2.0}
    assert cost_at(costs, 0) == 1.0 and cost_at(costs, 4) == pytest.approx(1.1)
    assert cost_at(costs, 12) == pytest.approx(1.6) and cost_at(costs, 40) == 2.0  # held past the last size


def test_forward_seconds_times_every_size():
    model = tiny_model(0, vocab=64)
    context = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(0))
    seconds = forward_seconds(model, context, (0, 4, 16), repeats=2, progress=False)
    assert sorted(seconds) == [0, 4, 16] and all(s > 0 for s in seconds.values())


def test_predicted_speedup_divides_tau_by_the_cost(tmp_path):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"relative": {"0": 1.0, "10": 1.5}}))
    results = {"rest": {"problems": 2, "tau": 3.0, "median_tau": 3.0, "draft_per_step": 10.0, "alpha": 0.2}}
    add_predicted_speedup(results, cost)
    assert results["rest"]["predicted_speedup"] == pytest.approx(2.0)
    assert replay_table(results).splitlines()[-1].endswith("| 1.50 | 2.00x |")
    with pytest.raises(FileNotFoundError, match="evals.forward_cost"):
        add_predicted_speedup(results, tmp_path / "none.json")
