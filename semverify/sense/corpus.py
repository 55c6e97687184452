"""SENSE's in-distribution ("ID") corpus: the target's own greedy answers to train prompts.

Retrieval only helps when the datastore reads like what the target writes. GSM8K's reference
solutions are terse; an instruct model answers in its own markdown style, so the paper's ID
datastore stores the target's responses instead. Answers are generated in left-padded batches
and appended to a JSONL file as they finish, so a rerun resumes where the last one stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm


def generate_answers(model, tokenizer, prompts: Sequence[str], path: str | os.PathLike, batch_size: int = 8,
                     max_new_tokens: int = 384, progress: bool = True) -> list[tuple[str, str]]:
    """Greedy answers of ``model`` to ``prompts`` as (prompt, answer) pairs, cached in ``path`` (JSONL,
    one line per prompt index); prompts already answered there are not generated again."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}")
    path = Path(path)
    done = _read_answers(path, prompts)
    todo = [i for i in range(len(prompts)) if i not in done]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="ID answers", unit="answer",
               disable=not progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as sink:
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            for i, answer in zip(batch, _greedy_batch(model, tokenizer, [prompts[i] for i in batch], pad_id,
                                                      max_new_tokens, device)):
                done[i] = answer
                sink.write(json.dumps({"index": i, "prompt": prompts[i], "answer": answer}) + "\n")
            sink.flush()
            bar.update(len(batch))
    bar.close()
    return [(prompts[i], done[i]) for i in range(len(prompts)) if done[i]]


def _read_answers(path: Path, prompts: Sequence[str]) -> dict[int, str]:
    """Answers already in ``path`` whose prompt still matches; a line cut off by a crash is skipped."""
    done: dict[int, str] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        i = row.get("index")
        if isinstance(i, int) and 0 <= i < len(prompts) and row.get("prompt") == prompts[i]:
            done[i] = row["answer"]
    return done


@torch.no_grad()
def _greedy_batch(model, tokenizer, prompts: list[str], pad_id: int, max_new_tokens: int, device) -> list[str]:
    """One left-padded batch through ``model.generate`` (greedy); the answers without special tokens."""
    encoded = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    width = max(map(len, encoded))
    ids = torch.tensor([[pad_id] * (width - len(e)) + e for e in encoded], device=device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=pad_id, top_p=None, top_k=None, temperature=None)
    return [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out]
