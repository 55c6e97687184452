"""GSM8K problems from a local jsonl (the shared dev split here) and the chat prompt used to ask them."""

from __future__ import annotations

import json
from pathlib import Path

DEFAULT_DEV = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test_dev.jsonl"
INSTRUCTION = "Solve the problem step by step, then end with 'Final Answer: <number>'."


def load_problems(path: str | Path = DEFAULT_DEV, limit: int | None = None) -> list[dict]:
    """Rows with ``id``, ``question`` and ``answer`` (the text after ``####``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file not found: {path} (pass --data PATH to a jsonl with question/answer)")
    rows = []
    with open(path) as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            item = json.loads(line)
            rows.append({"id": i, "question": item["question"], "answer": item["answer"].split("####")[-1].strip()})
    return rows


def chat_prompt(tokenizer, question: str) -> str:
    """The zero-shot chat prompt: the question followed by the answer-format instruction."""
    messages = [{"role": "user", "content": f"{question}\n{INSTRUCTION}"}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
