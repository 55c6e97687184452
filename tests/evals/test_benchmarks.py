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


def test_math500_ships_with_semverify():
    from evals.benchmarks import MATH500

    problems = MATH500().load("auto")
    assert len(problems) == 500 and problems[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert {p.meta["subject"] for p in problems} >= {"Algebra", "Geometry"} and {p.meta["level"] for p in problems} == {
        1, 2, 3, 4, 5}
    prompt = MATH500().prompt(byte_tokenizer(), problems[2])
    assert problems[2].question in prompt and "\\boxed{}" in prompt
    assert MATH500().grade("so $\\boxed{\\frac{14}{3}}$", problems[2]) == {"boxed": True, "math_verify": True}
    with pytest.raises(ValueError, match="unknown prompt template 'fewshot' for math500"):
        MATH500().prompt(byte_tokenizer(), problems[0], "fewshot")
    with pytest.raises(ValueError, match="test split only"):
        MATH500().load("auto", split="train")


def test_compare_on_math500_reports_subjects_and_levels(tiny_checkpoint, tmp_path):
    import json

    from semverify.cli import main

    data = tmp_path / "math.jsonl"
    rows = [{"problem": f"What is {a} + {a}?", "answer": str(2 * a), "subject": s, "level": lv}
            for a, s, lv in ((1, "Algebra", 1), (2, "Algebra", 2), (3, "Geometry", 1))]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    main(["compare", "--benchmark", "math500", "--data", str(data), "--target", str(tiny_checkpoint), "--methods",
          "vanilla,pld", "--limit", "3", "--max-new-tokens", "6", "--dtype", "float32", "--out", str(out)])
    written = [json.loads(line) for line in (out / "rows.rank0.jsonl").open()]
    assert set(written[0]["grades"]) == {"boxed", "math_verify"} and written[0]["meta"]["subject"] in {"Algebra",
                                                                                                       "Geometry"}
    report = (out / "report.md").read_text()
    assert "| method | lossless | boxed | math-verify |" in report
    assert "math_verify accuracy by subject:" in report and "| Geometry | 0/1 | 0/1 |" in report
    assert "math_verify accuracy by level:" in report
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "1"}\n')
    with pytest.raises(SystemExit, match="line 1: no 'problem' field"):
        main(["compare", "--benchmark", "math500", "--data", str(bad), "--target", str(tiny_checkpoint),
              "--out", str(tmp_path / "bad")])
