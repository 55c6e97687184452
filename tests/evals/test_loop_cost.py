"""``semverify loop-cost``: the oracle drafter, the sync counter and the command's files."""

from __future__ import annotations

import json

import pytest
import torch

import semverify
from evals.loop_cost import COLUMNS, OracleDrafter, SyncCounter, random_batch
from semverify.cli import main
from semverify.machine import machine
from tests.helpers import TINY_VOCAB, tiny_model

GREEDY = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("new_tokens", [15, 13])  # 13: the last step drafts what is left of the budget
def test_the_oracle_drafts_the_targets_own_tokens_and_every_draft_is_accepted(batch, new_tokens):
    model = tiny_model(0)
    ids, mask = random_batch(TINY_VOCAB, batch, 8)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, **GREEDY)
    oracle = OracleDrafter(expected[:, ids.shape[1]:])
    out = semverify.generate(model, ids, attention_mask=mask, drafter=oracle, num_assistant_tokens=4,
                             max_new_tokens=new_tokens, return_dict_in_generate=True, **GREEDY)
    assert torch.equal(out.sequences, expected)
    for row in out.spec_stats.rows or [out.spec_stats]:
        assert row.accepted == row.drafted  # every draft token kept
        assert row.accept_lengths[:-1] == [4] * (len(row.accept_lengths) - 1)  # tau = k + 1 but at the end
        assert row.steps == -(-new_tokens // 5)


def test_the_ragged_oracle_keeps_a_different_prefix_in_each_row():
    model = tiny_model(0)
    ids, mask = random_batch(TINY_VOCAB, 3, 8)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=20, **GREEDY)
    oracle = OracleDrafter(expected[:, ids.shape[1]:]).as_ragged(TINY_VOCAB)
    out = semverify.generate(model, ids, attention_mask=mask, drafter=oracle, num_assistant_tokens=4,
                             max_new_tokens=20, return_dict_in_generate=True, **GREEDY)
    assert torch.equal(out.sequences, expected)  # lossless: every wrong token is rejected
    firsts = [row.accept_lengths[0] for row in out.spec_stats.rows]
    assert firsts == [0, 1, 2]  # row r keeps r tokens of its first draft


def test_the_sync_counter_counts_reads_and_where_they_happen():
    class Reads(torch.nn.Module):
        def forward(self, x):
            return x.sum().item()

    module, x = Reads(), torch.arange(6)
    with SyncCounter() as counter:
        counter.watch(module)
        assert x[2].item() == 2  # one read on the host
        y = x + 1  # no read
        _ = y[y > 3]  # a value-dependent shape
        module(x)  # a read inside a forward
        if bool(x.any()):
            pass
    assert counter.counts == {("host", "read", "item", "cpu"): 1, ("host", "shape", "__getitem__", "cpu"): 1,
                              ("forward", "read", "item", "cpu"): 1, ("host", "read", "__bool__", "cpu"): 1}
    assert counter.total == 4 and counter.depth == 0


def test_the_command_writes_the_table_and_every_sample(tmp_path, capsys):
    assert main(["loop-cost", "--model", "tiny", "--vocab", str(TINY_VOCAB), "--batches", "1,2", "--prompts", "8",
                 "--new-tokens", "15", "--repeats", "2", "--threads", "1", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "loop-cost.json").read_text())
    assert saved["environment"]["machine"] == machine() and saved["environment"]["torch"] == torch.__version__
    cells = {c["batch"]: c for c in saved["cells"]}
    assert sorted(cells) == [1, 2] and "assisted" in cells[1] and "assisted" not in cells[2]
    for c in cells.values():
        assert c["oracle"]["identical_to_generate"] and c["oracle"]["tokens_per_step"] == 5.0
        assert c["plain"]["steps"] == 15 and len(c["plain"]["samples_ms_per_step"]) == 2
        assert c["oracle"]["steps"] == c["oracle"]["target_forwards"] == 3 and c["oracle"]["prefill_removed"]
        assert c["oracle"]["syncs_per_step"] > 0 and 0.5 < c["oracle"]["kv_width_over_live"] <= 1
        ragged = c["ragged"]  # rows keep different numbers of draft tokens: lossless, fewer tokens a step
        assert ragged["identical_to_generate"] and 1 <= ragged["tokens_per_step"] < 5
        assert ragged["kv_width_over_live"] >= c["oracle"]["kv_width_over_live"]
        assert c["perfect_drafter_speedup"] == pytest.approx(5 * c["plain"]["ms_per_step"] / c["oracle"]["ms_per_step"])
    assert set(saved["sync_growth_per_row"]) == {"8"}
    table = (tmp_path / "loop-cost.md").read_text()
    assert table == capsys.readouterr().out.rstrip("\n") + "\n"
    header = next(line for line in table.splitlines() if line.startswith("| model"))
    assert [h.strip() for h in header.strip("|").split("|")] == list(COLUMNS)
    assert f"machine: {machine()}" in table
    assert len([line for line in table.splitlines() if line.startswith("| tiny")]) == 2


def test_a_folder_with_only_a_config_runs_on_random_weights(tmp_path):
    folder = tmp_path / "shapes"
    tiny_model(0).config.save_pretrained(folder)  # config.json alone, as the GPU check's CONFIGS
    assert main(["loop-cost", "--model", str(folder), "--draft", str(folder), "--random-weights", "--batches", "1",
                 "--prompts", "8", "--new-tokens", "10", "--repeats", "1", "--threads", "1",
                 "--out", str(tmp_path / "out")]) == 0
    (cell,) = json.loads((tmp_path / "out" / "loop-cost.json").read_text())["cells"]
    assert cell["oracle"]["identical_to_generate"] and {"draft", "assisted"} <= set(cell)
