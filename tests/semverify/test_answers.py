"""A model's own answers to many prompts: batched, left-padded, resumable, with their token ids."""

from __future__ import annotations

import json

import torch

from semverify.answers import generate_answers
from tests.helpers import byte_tokenizer, tiny_model


def test_answers_are_the_greedy_outputs_and_resume(tmp_path):
    tok = byte_tokenizer()
    model = tiny_model(0, arch="llama", vocab=len(tok))
    prompts = [f"Question {i}: " + "?" * 3 * i for i in range(3)]  # lengths differ: left padding
    path = tmp_path / "answers.jsonl"
    first = generate_answers(model, tok, prompts[:2], path, batch_size=2, max_new_tokens=6, progress=False)
    for answer in first:  # batched left-padded generation gives each prompt's own greedy answer
        ids = tok(answer.prompt, return_tensors="pt", add_special_tokens=False).input_ids
        alone = model.generate(ids, do_sample=False, max_new_tokens=6)
        assert answer.text == tok.decode(alone[0, ids.shape[1]:], skip_special_tokens=True).strip()
        assert list(answer.ids) == alone[0, ids.shape[1]:].tolist()
    path.write_text(path.read_text() + '{"index": 2, "prom')  # a line cut off by a crash
    again = generate_answers(model, tok, prompts, path, batch_size=2, max_new_tokens=6, progress=False)
    assert again[:2] == first and len(again) == 3
    assert sum(1 for line in path.read_text().splitlines() if line.endswith("}")) == 3


def test_sampled_answers_are_seeded_per_batch(tmp_path):
    tok = byte_tokenizer()
    model = tiny_model(0, arch="llama", vocab=len(tok))
    prompts = [f"Question {i}: " for i in range(3)]
    runs = [generate_answers(model, tok, prompts, tmp_path / f"{n}.jsonl", batch_size=2, max_new_tokens=6,
                             do_sample=True, temperature=1.0, seed=3, progress=False) for n in range(2)]
    assert runs[0] == runs[1]  # the same seed draws the same answers
    other = generate_answers(model, tok, prompts, tmp_path / "other.jsonl", batch_size=2, max_new_tokens=6,
                             do_sample=True, temperature=1.0, seed=4, progress=False)
    assert [a.ids for a in other] != [a.ids for a in runs[0]]
    assert [json.loads(line)["index"] for line in (tmp_path / "0.jsonl").open()] == [0, 1, 2]
    assert all(isinstance(torch.tensor(a.ids), torch.Tensor) for a in other)
