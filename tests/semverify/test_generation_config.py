"""generate() as a drop-in for model.generate: logits processors, stop strings and stopping criteria give
transformers' own output token for token (fp32 greedy), sampled processors keep the target's
distribution, and every GenerationConfig field is honoured or refused by name."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from semverify import ModelDrafter, Sampler, SpeculativeSampling, generate
from semverify.engine.loop import speculative_generate
from semverify.generation_config import BOOKKEEPING, HONOURED, NEUTRAL
from tests.helpers import byte_tokenizer, tiny_model

TOK = byte_tokenizer()
IDS = TOK("Question: what is 2 + 2? Answer:", return_tensors="pt").input_ids
def unused(free: torch.Tensor) -> int:
    """A token the free output never writes."""
    return next(t for t in range(len(TOK)) if t not in free.tolist())


# each setting as a function of the free greedy output's new tokens, so that it changes that output
PROCESSORS = {
    "repetition_penalty": lambda free: dict(repetition_penalty=3.0),
    "no_repeat_ngram_size": lambda free: dict(no_repeat_ngram_size=2),
    "min_new_tokens": lambda free: dict(min_new_tokens=12, eos_token_id=int(free[4])),
    "bad_words_ids": lambda free: dict(bad_words_ids=[[int(free[2])], [int(free[5]), int(free[6])]]),
    "suppress_tokens": lambda free: dict(suppress_tokens=[int(free[3])]),
    "begin_suppress_tokens": lambda free: dict(begin_suppress_tokens=[int(free[0])]),
    "sequence_bias": lambda free: dict(sequence_bias={(int(free[1]),): -20.0}),
    "exponential_decay_length_penalty": lambda free: dict(exponential_decay_length_penalty=(2, 30.0),
                                                          eos_token_id=int(free[8])),
    "forced_eos_token_id": lambda free: dict(forced_eos_token_id=unused(free), eos_token_id=unused(free),
                                             max_new_tokens=8),
}
DRAFTERS = {"draft model": lambda draft: dict(assistant_model=draft), "prompt lookup": lambda draft: dict(
    prompt_lookup_num_tokens=3)}


@pytest.fixture(scope="module")
def pair():
    # peaked random models (init_std 0.3), so that penalties and bans change what greedy decoding picks
    target = tiny_model(0, arch="llama", vocab=len(TOK), init_std=0.3)
    draft = tiny_model(1, arch="llama", vocab=len(TOK), init_std=0.3)
    return target, draft


def free_output(target, **kwargs):
    return target.generate(IDS, max_new_tokens=24, do_sample=False, pad_token_id=0, tokenizer=TOK, **kwargs)


@pytest.mark.parametrize("drafting", list(DRAFTERS))
@pytest.mark.parametrize("name", list(PROCESSORS))
def test_processors_match_model_generate(pair, name, drafting):
    target, draft = pair
    free = free_output(target)[0, IDS.shape[1]:]
    kwargs = {"max_new_tokens": 24, **PROCESSORS[name](free)}
    expected = target.generate(IDS, do_sample=False, pad_token_id=0, **kwargs)
    plain = {k: v for k, v in kwargs.items() if k in ("max_new_tokens", "eos_token_id")}
    assert not torch.equal(expected, target.generate(IDS, do_sample=False, pad_token_id=0, **plain))  # it acts
    out = generate(target, IDS, do_sample=False, **kwargs, **DRAFTERS[drafting](draft))
    assert torch.equal(out, expected)


@pytest.mark.parametrize("drafting", list(DRAFTERS))
def test_stop_strings_end_the_output_where_transformers_does(pair, drafting):
    target, draft = pair
    free = free_output(target)[0, IDS.shape[1]:]
    at = next(i for i in range(3, 20) if TOK.decode(free[i : i + 1]).isascii()
              and TOK.decode(free[i : i + 1]).isprintable())  # a printable character the output writes
    stop = TOK.decode(free[at : at + 1])
    expected = free_output(target, stop_strings=[stop])
    out = generate(target, IDS, max_new_tokens=24, stop_strings=[stop], tokenizer=TOK, **DRAFTERS[drafting](draft))
    assert torch.equal(out, expected) and out.shape[1] < IDS.shape[1] + 24
    with pytest.raises(ValueError, match="stop_strings need the tokenizer"):
        generate(target, IDS, max_new_tokens=4, stop_strings=[stop])


class StopAt(StoppingCriteria):
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


class Ban(LogitsProcessor):
    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores):
        scores[:, self.token] = float("-inf")
        return scores


def test_custom_stopping_criteria_and_logits_processors(pair):
    target, draft = pair
    free = free_output(target)[0, IDS.shape[1]:]
    stop, banned = StopAt(int(free[6])), Ban(int(free[2]))
    expected = target.generate(IDS, max_new_tokens=24, do_sample=False, pad_token_id=0, stopping_criteria=[stop],
                               logits_processor=LogitsProcessorList([banned]))
    out = generate(target, IDS, assistant_model=draft, max_new_tokens=24, stopping_criteria=[stop],
                   logits_processor=LogitsProcessorList([banned]))
    assert torch.equal(out, expected) and int(free[2]) not in out[0, IDS.shape[1]:].tolist()


def test_processors_apply_per_row_of_a_batch(pair):
    target, draft = pair
    rows = [IDS[0], IDS[0, 5:]]
    alone = [generate(target, r[None], assistant_model=draft, max_new_tokens=16, repetition_penalty=1.5)[0, len(r):]
             for r in rows]
    width = len(rows[0])
    ids = torch.stack([rows[0], torch.cat([torch.zeros(5, dtype=torch.long), rows[1]])])
    mask = (torch.arange(width)[None, :] >= torch.tensor([[0], [5]])).long()
    out = generate(target, ids, attention_mask=mask, assistant_model=draft, max_new_tokens=16, repetition_penalty=1.5)
    for row, tokens in enumerate(alone):  # each row's penalties see its own tokens, as if it were alone
        assert torch.equal(out[row, width:], tokens)


def test_every_generation_config_field_is_honoured_or_refused_by_name(pair):
    target, _ = pair
    fields = set(GenerationConfig().to_dict())
    assert fields == HONOURED | set(NEUTRAL) | BOOKKEEPING  # a new transformers field must be classified
    assert not (HONOURED & set(NEUTRAL)) and not (HONOURED & BOOKKEEPING) and not (set(NEUTRAL) & BOOKKEEPING)
    for name, neutral in NEUTRAL.items():
        value = 2 if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in neutral) else "other"
        if value in neutral:
            value = 3
        config = GenerationConfig()
        setattr(config, name, value)
        with pytest.raises(NotImplementedError, match=f"{name}="):
            generate(target, IDS, max_new_tokens=2, generation_config=config)
        setattr(config, name, neutral[-1])
        generate(target, IDS, max_new_tokens=2, generation_config=config)


# -- sampled decoding with a processor keeps the (processed) target distribution --------------------------

V = 8
PROMPT = torch.tensor([[1, 2, 3, 1, 2]])


def test_sampled_decoding_with_a_repetition_penalty_follows_the_processed_target():
    target, draft = tiny_model(0, vocab=V, init_std=0.5), tiny_model(1, vocab=V, init_std=0.5)
    penalty = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(5.0)])
    sampler = Sampler(True, 1.0, processors=(penalty,))
    with torch.inference_mode():
        p1 = torch.softmax(penalty(PROMPT, target(PROMPT).logits[:, -1].clone())[0], -1)
        seqs = torch.cat([PROMPT.repeat(V, 1), torch.arange(V)[:, None]], dim=1)
        p2 = torch.softmax(penalty(seqs, target(seqs).logits[:, -1].clone()), -1)
    exact = (p1[:, None] * p2).flatten()
    runs, counts, g = 3000, torch.zeros(V * V), torch.Generator().manual_seed(0)
    for _ in range(runs):
        out, _ = speculative_generate(target, PROMPT, drafter=ModelDrafter(draft), rule=SpeculativeSampling(),
                                      k=2, max_new_tokens=2, sampler=sampler, generator=g)
        counts[out[0, -2] * V + out[0, -1]] += 1
    expected = exact * runs
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]]).numpy()
    exp = torch.cat([expected[big], expected[~big].sum()[None]]).numpy()
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    plain = torch.softmax(target(PROMPT).logits[0, -1], -1).detach()
    assert (p1 - plain).abs().max() > 0.01  # the penalty does change the distribution being matched
