"""SemanticSpec: step segmentation, probes, the step rule on tensors, and the step loop on tiny models."""

from __future__ import annotations

import pytest
import torch

from semverify import Draft, get_rule, speculative_generate
from semverify.registry import RunContext
from semverify.semanticspec import (
    ProbeError,
    SemanticProbe,
    SemanticStepRule,
    StepDraft,
    StepDrafter,
    StepSegmenter,
    make_semanticspec,
)
from semverify.types import VerifyInput
from tests.helpers import byte_tokenizer, tiny_model

TOK = byte_tokenizer()


@pytest.mark.parametrize("text, stops, pieces", [
    ("First 2+2=4.\n\nThen 4*3=12.\n\nFinal Answer: 12", ("\n\n",),
     ["First 2+2=4.\n\n", "Then 4*3=12.\n\n", "Final Answer: 12"]),
    ("a\n\n\n\nb", ("\n\n",), ["a\n\n\n\n", "b"]),
    ("no break at all", ("\n\n",), ["no break at all"]),
    ("x. y? z", (". ", "? "), ["x. ", "y? ", "z"]),
    ("ends here\n\n", ("\n\n",), ["ends here\n\n"]),
    ("", ("\n\n",), []),
])
def test_split(text, stops, pieces):
    seg = StepSegmenter(TOK, stops=stops)
    assert seg.split(text) == pieces and "".join(seg.split(text)) == text


def test_step_ends_on_stop_strings_spanning_tokens_and_at_the_cap():
    seg = StepSegmenter(TOK, stops=("\n\n", "Wait"), max_step_tokens=50)
    ids = lambda s: TOK(s, add_special_tokens=False).input_ids  # noqa: E731
    assert seg.ends_step(ids("So 3 apples.\n\n"))  # byte-level: the break is two tokens
    assert seg.ends_step(ids("Hmm. Wait"))
    assert not seg.ends_step(ids("So 3 apples.\n"))
    assert StepSegmenter(TOK, max_step_tokens=4).ends_step(ids("abcd"))
    assert seg.contains_break(ids("a\n\nb")) and not seg.contains_break(ids("a\nb"))
    with pytest.raises(ValueError, match="max_step_tokens"):
        StepSegmenter(TOK, max_step_tokens=0)
    with pytest.raises(ValueError, match="stops"):
        StepSegmenter(TOK, stops=())


def test_probe_round_trip_and_model_checks(tmp_path):
    probe = SemanticProbe(32, width=16, model="tiny-draft", meta={"r2": 0.5})
    x = torch.randn(4, 32)
    path = probe.save(tmp_path / "p.pt")
    loaded = SemanticProbe.load(path, model="tiny-draft", hidden_size=32)
    assert torch.equal(probe.eval()(x), loaded(x)) and loaded.meta == {"r2": 0.5}
    assert ((loaded(x) > 0) & (loaded(x) < 1)).all()
    with pytest.raises(ProbeError, match="hidden size 32"):
        SemanticProbe.load(path, hidden_size=64)
    with pytest.raises(ProbeError, match="trained for tiny-draft, not other"):
        SemanticProbe.load(path, model="other")
    with pytest.raises(ProbeError, match="hidden size 32, got 8"):
        loaded(torch.randn(1, 8))
    (tmp_path / "bad.pt").write_text("garbage")
    with pytest.raises(ProbeError, match="not a readable"):
        SemanticProbe.load(tmp_path / "bad.pt")
    with pytest.raises(FileNotFoundError, match="semverify probes"):
        SemanticProbe.load(tmp_path / "missing.pt")


class ConstantProbe(SemanticProbe):
    def __init__(self, value: float, hidden_size: int = 8, pair: str = "test-pair"):
        super().__init__(hidden_size, width=4, meta={"pair": pair})
        self.value = value

    def forward(self, hidden):
        return torch.full(hidden.shape[:-1], self.value)


def step_input(k: int, seed: int = 0) -> VerifyInput:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, k + 1, 10, generator=g)
    draft = StepDraft(tokens=torch.randint(0, 10, (1, k), generator=g), pooled_hidden=torch.randn(1, 8))
    return VerifyInput(draft, logits, False, torch.randn(1, k + 1, 8, generator=g), torch.Generator().manual_seed(seed))


def test_step_rule_accepts_whole_steps_or_nothing():
    x = step_input(4)
    v = SemanticStepRule(ConstantProbe(0.5), ConstantProbe(0.6), r_min=0.5)(x)  # r = min(1, 1.2) = 1
    assert int(v.n_accepted) == 4 and int(v.next_token) == int(x.target_logits[0, 4].argmax())
    assert v.reasons["step"].all() and not v.reasons["step_rejected"].any()
    v = SemanticStepRule(ConstantProbe(0.5), ConstantProbe(0.2), r_min=0.5)(x)  # r = 0.4 < r_min
    assert int(v.n_accepted) == 0 and int(v.next_token) == int(x.target_logits[0, 0].argmax())
    assert v.reasons["step_rejected"].tolist() == [[True, False, False, False]]
    v = SemanticStepRule(ConstantProbe(0.5), ConstantProbe(0.9), r_min=1.01)(x)  # r is capped at 1
    assert int(v.n_accepted) == 0
    # the unclipped ratio and both probabilities are reported as this step's scores
    assert {k: round(float(t), 4) for k, t in v.scores.items()} == {"p_target": 0.9, "p_draft": 0.5, "step_ratio": 1.8,
                                                              "step_accepted": 0.0}


def test_step_rule_draws_with_probability_r():
    rule = SemanticStepRule(ConstantProbe(0.8), ConstantProbe(0.4), r_min=0.0)  # r = 0.5
    accepted = sum(int(rule(step_input(3, seed)).n_accepted) == 3 for seed in range(2000))
    assert 900 < accepted < 1100


def test_step_rule_refuses_plain_drafts():
    x = step_input(3)
    x.draft = Draft(tokens=x.draft.tokens)  # not from a step drafter
    with pytest.raises(ValueError, match="StepDrafter"):
        SemanticStepRule(ConstantProbe(0.5), ConstantProbe(0.5))(x)


def test_factory_needs_probes(tmp_path):
    with pytest.raises(ValueError, match="draft probe"):
        make_semanticspec(RunContext())
    with pytest.raises(FileNotFoundError, match="semverify probes --draft nobody/model --target nobody/big"):
        make_semanticspec(RunContext(draft_model="nobody/model", target_model="nobody/big"),
                          target_probe=ConstantProbe(0.5))
    p = SemanticProbe(8, width=4, meta={"pair": "x"}).save(tmp_path / "d.pt")
    rule = get_rule("semanticspec", draft_probe=str(p), target_probe=str(p), r_min=0.7)
    assert rule.r_min == 0.7 and isinstance(rule.draft_probe, SemanticProbe)
    assert rule.artifacts == (str(p), str(p))


def test_probes_of_different_pairs_are_refused_naming_the_files(tmp_path):
    draft = SemanticProbe(8, width=4, meta={"pair": "a"}).save(tmp_path / "draft.pt")
    target = SemanticProbe(8, width=4, meta={"pair": "b"}).save(tmp_path / "target.pt")
    legacy = SemanticProbe(8, width=4).save(tmp_path / "legacy.pt")  # trained alone: no pair
    for d, t in ((draft, target), (legacy, legacy)):
        with pytest.raises(ProbeError, match=f"draft probe \\({d}\\).*target probe \\({t}\\).*base rates"):
            get_rule("semanticspec", draft_probe=str(d), target_probe=str(t))
    wide = SemanticProbe(16, width=4, meta={"pair": "c"}).save(tmp_path / "wide.pt")
    rule = get_rule("semanticspec", draft_probe=str(wide), target_probe=str(wide))
    with pytest.raises(ProbeError, match=f"{wide} reads hidden size 16, got 8"):
        rule(step_input(3))  # a probe for a model with another hidden size


# step loop on tiny models: random byte-level models write broken UTF-8, so the replacement character
# is their most frequent "character"; as a stop string it makes many short steps
STOPS = ("\ufffd", " ", "e")


def models(seed: int):
    target = tiny_model(seed, arch="llama", vocab=len(TOK))
    draft = tiny_model(seed + 20, arch="llama", vocab=len(TOK))
    h = target.config.hidden_size
    pair = {"pair": "tiny"}
    return (target, draft, SemanticProbe(h, width=8, meta=pair),
            SemanticProbe(draft.config.hidden_size, width=8, meta=pair))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("target_first", [True, False])
def test_r_min_above_one_is_exactly_the_target(seed, target_first):
    target, draft, t_probe, d_probe = models(seed)
    ids = TOK("Question: what is 2 + 2?", return_tensors="pt").input_ids
    expected = target.generate(ids, do_sample=False, max_new_tokens=40)
    drafter = StepDrafter(draft, StepSegmenter(TOK, stops=STOPS, max_step_tokens=6), token_k=3,
                          target_first_step=target_first)
    out, stats = speculative_generate(target, ids, drafter=drafter, rule=SemanticStepRule(d_probe, t_probe, r_min=1.5),
                                      k=6, max_new_tokens=40)
    assert torch.equal(out, expected)
    assert stats.reasons["step_rejected"] > 0 and stats.reasons["step"] == 0


def test_accepted_steps_are_the_drafts_own_steps():
    target, draft, _, _ = models(3)
    ids = TOK("Question: what is 2 + 2?", return_tensors="pt").input_ids
    drafter = StepDrafter(draft, StepSegmenter(TOK, stops=STOPS, max_step_tokens=6), token_k=3,
                          target_first_step=False)
    rule = SemanticStepRule(ConstantProbe(0.5, draft.config.hidden_size),
                            ConstantProbe(0.5, target.config.hidden_size), r_min=0.5)  # r = 1: accept all steps
    steps = []

    def on_step(event):
        n = int(event.verdict.n_accepted[0])
        if n:
            steps.append((event.sequences[:, : event.sequences.shape[1] - n - 1], event.draft.tokens[:, :n]))

    _, stats = speculative_generate(target, ids, drafter=drafter, rule=rule, k=6, max_new_tokens=30,
                                    on_step=on_step)
    assert stats.reasons["step"] > 0 and stats.reasons["step_rejected"] == 0
    assert stats.accepted == stats.reasons["step"] and stats.new_tokens == stats.accepted + stats.steps
    assert len(stats.scores["step_ratio"]) == len(steps) and set(stats.scores["step_ratio"]) == {1.0}
    for prefix, step in steps:  # each accepted step is the draft's own greedy continuation
        alone = draft.generate(prefix, do_sample=False, max_new_tokens=step.shape[1], min_new_tokens=step.shape[1])
        assert torch.equal(alone[:, prefix.shape[1]:], step)


def test_compare_runs_semanticspec_and_its_lossless_limit(tmp_path, monkeypatch, tiny_checkpoint):
    import json

    from transformers import AutoConfig

    from semverify.cli import main
    from semverify.semanticspec import pair_key

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path / "cache"))
    hidden = AutoConfig.from_pretrained(tiny_checkpoint).hidden_size
    for role in ("draft", "target"):
        SemanticProbe(hidden, width=8, model=str(tiny_checkpoint), meta={"pair": "tiny"}).save(
            tmp_path / "cache" / "probes" / pair_key(tiny_checkpoint, tiny_checkpoint) / f"{role}.pt")
    out = tmp_path / "run"
    main(["compare", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--data", "sample",
          "--limit", "2", "--max-new-tokens", "12", "--dtype", "float32",
          "--methods", "vanilla,semanticspec:r_min=2,semanticspec:r_min=0,k=4", "--out", str(out), "--no-report"])
    rows = {(r["id"], r["method"]): r for r in map(json.loads, (out / "rows.rank0.jsonl").open())}
    assert len(rows) == 6
    for i in range(2):
        assert rows[(i, "semanticspec:r_min=2")]["output"] == rows[(i, "vanilla")]["output"]
    # draft == target and no paragraph break in the byte-level text: the first step stays token-level
    assert all(rows[(i, "semanticspec:r_min=0,k=4")]["tau"] > 1 for i in range(2))


def test_generate_with_an_assistant_model_drafts_steps_and_finds_probes_by_name(tmp_path, monkeypatch,
                                                                               tiny_checkpoint):
    """``rule="semanticspec"`` with ``assistant_model=``: generate() wraps the assistant in a
    StepDrafter and finds both probes by the models' names; at r_min > 1 it is the target alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from semverify import generate
    from semverify.semanticspec import pair_key

    monkeypatch.setenv("SEMVERIFY_CACHE", str(tmp_path / "cache"))
    target = AutoModelForCausalLM.from_pretrained(tiny_checkpoint)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    probe = SemanticProbe(target.config.hidden_size, width=8, model=str(tiny_checkpoint), meta={"pair": "tiny"})
    for role in ("draft", "target"):
        probe.save(tmp_path / "cache" / "probes" / pair_key(tiny_checkpoint, tiny_checkpoint) / f"{role}.pt")
    ids = tok("Question: what is 2 + 2?\n\n", return_tensors="pt").input_ids
    out = generate(target, ids, assistant_model=target, tokenizer=tok, rule="semanticspec",
                   max_new_tokens=16, return_dict_in_generate=True)
    assert out.sequences.shape[1] == ids.shape[1] + 16
    expected = target.generate(ids, do_sample=False, max_new_tokens=16)
    strict = SemanticStepRule(probe, probe, r_min=1.5)
    assert torch.equal(generate(target, ids, assistant_model=target, tokenizer=tok, rule=strict,
                                max_new_tokens=16), expected)
    with pytest.raises(ValueError, match="tokenizer= in generate"):
        generate(target, ids, assistant_model=target, rule=strict, max_new_tokens=4)
