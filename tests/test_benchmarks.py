"""GSM8K loading and prompts."""

import pytest

from evals.benchmarks import GSM8K, SHARED_DEV, get_benchmark, worked_answer

from .conftest import byte_tokenizer


def test_sample_and_local_file():
    sample = GSM8K().load("sample")
    assert len(sample) == 20 and sample[0].answer == "18" and sample[0].id == 0
    assert len(GSM8K().load("sample", limit=3)) == 3
    if SHARED_DEV.is_file():
        dev = GSM8K().load("auto", limit=5)
        assert [p.question for p in dev] == [p.question for p in sample[:5]]


def test_gold_answers_drop_thousands_separators(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"question": "q", "answer": "work\\n#### 1,234"}\n')
    assert GSM8K().load(str(path))[0].answer == "1234"


def test_missing_file_and_offline_hub(monkeypatch):
    with pytest.raises(FileNotFoundError, match="not found"):
        GSM8K().load("/no/such.jsonl")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="could not load openai/gsm8k"):
        GSM8K().load("hub")
    with pytest.raises(ValueError, match="unknown benchmark"):
        get_benchmark("nope")


def test_prompt_templates():
    bench, tok = GSM8K(), byte_tokenizer()
    problem = bench.load("sample", limit=1)[0]
    zero = bench.prompt(tok, problem, "chat")
    few = bench.prompt(tok, problem, "fewshot")
    assert problem.question in zero and "Final Answer: <number>" in zero and zero.endswith("assistant\n")
    assert few.endswith(zero[zero.index("<|im_start|>user"):]) and few.count("Final Answer: ") >= 5
    assert "<<" not in few
    with pytest.raises(ValueError, match="unknown prompt template"):
        bench.prompt(tok, problem, "cot")


def test_worked_answer_format():
    assert worked_answer("She has 2+3 = <<2+3=5>>5 apples.\n#### 5") == "She has 2+3 = 5 apples.\nFinal Answer: 5"
