"""`semverify report RUN --against OTHER`: two runs of the same methods paired problem by problem."""

import json

import pytest

from evals.rerun import against
from evals.rows import RowWriter
from semverify.cli import main

SETTINGS = {"target": "t", "draft": "d", "dtype": "bfloat16", "benchmark": "gsm8k", "data": "sample",
            "template": "chat", "max_new_tokens": 8, "do_sample": False, "temperature": 1.0, "seed": 0}


def write_run(folder, rows, **settings):
    """A run folder with ``rows`` as (problem, method, correct, output) and these settings changed; the
    output ends with the gold answer 7 when correct, else with 8, since reports regrade rows."""
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"settings": {**SETTINGS, **settings}, "methods": []}))
    writer = RowWriter(folder / "rows.rank0.jsonl")
    for i, method, correct, output in rows:
        writer.write({"id": i, "method": method, "gold": "7", "output": f"{output}: {7 if correct else 8}",
                      "grades": {"strict": False, "flexible": correct, "math_verify": correct}})
    writer.close()
    return folder


def test_methods_pair_on_the_problems_both_runs_finished(tmp_path):
    first = write_run(tmp_path / "first", [(0, "vanilla", True, "a"), (1, "vanilla", True, "b"),
                                            (2, "vanilla", False, "c"), (3, "vanilla", True, "d"),
                                            (0, "pld", True, "a"), (0, "only_here", True, "a")])
    second = write_run(tmp_path / "second", [(0, "vanilla", True, "a"), (1, "vanilla", False, "b2"),
                                             (2, "vanilla", True, "c2"), (0, "pld", False, "z")],
                       batch_size=4)
    result = against(first, second)
    assert list(result["methods"]) == ["vanilla", "pld"]  # only_here is in one run only
    vanilla = result["methods"]["vanilla"]  # problem 3 is unfinished in the second run
    assert vanilla["problems"] == 3 and vanilla["identical"] == 1
    assert [a["correct"] for a in vanilla["accuracy"]] == [2, 2]
    assert (vanilla["only_method"], vanilla["only_reference"]) == (1, 1) and vanilla["p_value"] == 1.0
    assert result["methods"]["pld"]["only_method"] == 1 and result["methods"]["pld"]["identical"] == 0
    assert result["differ"] == {"batch_size": [None, 4]}


def test_the_cli_writes_the_table_and_refuses_other_benchmarks(tmp_path, capsys):
    first = write_run(tmp_path / "first", [(0, "vanilla", True, "a")])
    second = write_run(tmp_path / "second", [(0, "vanilla", True, "a")], dtype="float32")
    assert main(["report", str(first), "--against", str(second)]) == 0
    text = (first / "against-second.md").read_text()
    assert "dtype: bfloat16 here, float32 there" in text
    assert "| vanilla | 1 | 100.0 [20.7, 100.0] | 100.0 [20.7, 100.0] | 0 | 0 | 1.000 | 1/1 |" in text
    assert text in capsys.readouterr().out
    math = write_run(tmp_path / "math", [(0, "vanilla", True, "a")], benchmark="math500")
    with pytest.raises(ValueError, match="cannot be paired"):
        against(first, math)
    lonely = write_run(tmp_path / "lonely", [(0, "sd", True, "a")])
    with pytest.raises(ValueError, match="no method in common"):
        against(first, lonely)
