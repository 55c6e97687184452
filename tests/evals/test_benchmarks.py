"""GSM8K loading and prompts."""

import pytest

from evals.benchmarks import DEV, GSM8K, TRAIN, get_benchmark, worked_answer
from tests.helpers import byte_tokenizer


def test_sample_and_local_file():
    sample = GSM8K().load("sample")
    assert len(sample) == 20 and sample[0].answer == "18" and sample[0].id == 0
    assert len(GSM8K().load("sample", limit=3)) == 3 and len(GSM8K().load("sample", limit=50)) == 20
    dev = GSM8K().load("auto")  # the first 500 test problems ship with semverify; "sample" is their start
    assert len(dev) == 500 and [p.question for p in dev[:20]] == [p.question for p in sample]
    assert GSM8K().source_file("auto") == DEV and DEV.parent.name == "data" and "shared" not in str(DEV)


def test_the_train_split_ships_with_semverify():
    train = GSM8K().load("auto", split="train")
    assert len(train) == 7473 and GSM8K().source_file("auto", split="train") == TRAIN
    assert train[0].answer == "72" and "####" in train[0].solution


def test_bad_rows_name_their_line(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n\n{"question": "q"}\n')
    with pytest.raises(ValueError, match="g.jsonl, line 3: no 'answer' field"):
        GSM8K().load(str(path))
    path.write_text('{"question": "q", "answer": "#### 1"}\nnot json\n')
    with pytest.raises(ValueError, match="g.jsonl, line 2: not a JSON object"):
        GSM8K().load(str(path))


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
