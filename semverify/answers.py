"""A model's own answers to many prompts, in left-padded batches, appended to a JSONL file as they finish.

Offline builders need what a model actually writes: SENSE's in-distribution datastore stores the
target's greedy answers, and SemanticSpec's probe data cuts prefixes from sampled answers. A rerun
resumes where the last one stopped; each line keeps the answer's token ids as generated, so later
stages never re-tokenize text.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from .types import eos_ids


@dataclass(frozen=True)
class Answer:
    """One answer: its text (special tokens dropped, stripped) and the token ids the model generated."""

    prompt: str
    text: str
    ids: tuple[int, ...] = ()


def generate_answers(model, tokenizer, prompts: Sequence[str], path: str | os.PathLike, batch_size: int = 8,
                     max_new_tokens: int = 384, do_sample: bool = False, temperature: float = 1.0, seed: int = 0,
                     progress: bool = True, desc: str = "answers") -> list[Answer]:
    """Answers of ``model`` to ``prompts`` (greedy, or sampled at ``temperature`` with ``seed``), cached in
    ``path`` (JSONL, one line per prompt index); prompts already answered there are not generated again."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}")
    path = Path(path)
    done = _read_answers(path, prompts)
    todo = [i for i in range(len(prompts)) if i not in done]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if do_sample else dict(
        do_sample=False, top_p=None, top_k=None, temperature=None)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc=desc, unit="answer", disable=not progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as sink:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            if do_sample:  # transformers samples from the global generator: seed it per batch, by its first prompt
                torch.manual_seed(seed * 1_000_003 + batch[0])
            for i, ids in zip(batch, _batch(model, tokenizer, [prompts[i] for i in batch], pad_id, max_new_tokens,
                                            sampling)):
                done[i] = Answer(prompts[i], tokenizer.decode(ids, skip_special_tokens=True).strip(), tuple(ids))
                sink.write(json.dumps({"index": i, "prompt": prompts[i], "answer": done[i].text, "ids": ids}) + "\n")
            sink.flush()
            bar.update(len(batch))
    bar.close()
    return [done[i] for i in range(len(prompts)) if done[i].text]


def _read_answers(path: Path, prompts: Sequence[str]) -> dict[int, Answer]:
    """Answers already in ``path`` whose prompt still matches; a line cut off by a crash is skipped."""
    done: dict[int, Answer] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        i = row.get("index")
        if isinstance(i, int) and 0 <= i < len(prompts) and row.get("prompt") == prompts[i]:
            done[i] = Answer(prompts[i], row["answer"], tuple(row.get("ids", ())))
    return done


@torch.no_grad()
def _batch(model, tokenizer, prompts: list[str], pad_id: int, max_new_tokens: int, sampling: dict) -> list[list[int]]:
    """One left-padded batch through ``model.generate``; each answer's ids up to and including its EOS."""
    device = next(model.parameters()).device
    encoded = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    width = max(map(len, encoded))
    ids = torch.tensor([[pad_id] * (width - len(e)) + e for e in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                         **sampling)
    eos = set(eos_ids(model.generation_config.eos_token_id))
    answers = []
    for row in out[:, width:].tolist():
        end = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        answers.append(row[:end])
    return answers
