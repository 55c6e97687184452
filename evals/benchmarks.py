"""Benchmarks as a small registry; GSM8K from the data shipped with semverify, a local jsonl, or the hub.

Shipped (``evals/data``, MIT, see GSM8K_LICENSE): the train split (7,473 problems; calibration,
datastores, probes and few-shot prompts use it) and the first 500 problems of the test split (the dev
problems every committed run uses; ``sample`` is their first 20). Nothing is read from outside the package.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data"
TRAIN = DATA / "gsm8k_train.jsonl.gz"
DEV = DATA / "gsm8k_test_dev.jsonl"
SAMPLE_SIZE = 20
INSTRUCTION = "Solve the problem step by step, then end with 'Final Answer: <number>'."
TEMPLATES = ("chat", "fewshot")


@dataclass(frozen=True)
class Problem:
    id: int
    question: str
    answer: str  # the gold final answer as written after '####'
    solution: str = ""


def read_jsonl(path: Path, fields: tuple[str, ...]) -> list[dict]:
    """Rows of a (optionally gzipped) jsonl file; a row that is not JSON or lacks one of ``fields`` is
    refused with its line number."""
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}, line {number}: not a JSON object ({err.msg})") from None
            missing = [k for k in fields if not isinstance(row, dict) or k not in row]
            if missing:
                raise ValueError(f"{path}, line {number}: no {' or '.join(repr(k) for k in missing)} field "
                                 f"(each row needs {', '.join(fields)})")
            rows.append(row)
    return rows


class GSM8K:
    """Grade-school maths word problems (Cobbe et al. 2021), graded on the final number."""

    name = "gsm8k"
    fields = ("question", "answer")

    def source_file(self, source: str, split: str = "test") -> Path | None:
        """The file ``source`` reads (None for the hub): ``auto`` and ``sample`` are the shipped files."""
        if source == "hub":
            return None
        if source in ("auto", "sample"):
            return TRAIN if split == "train" else DEV
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"GSM8K data file not found: {path} (use --data PATH, 'auto', 'sample' or 'hub')")
        return path

    def load(self, source: str = "auto", limit: int | None = None, split: str = "test",
             offset: int = 0) -> list[Problem]:
        """Problems in file order, ``limit`` of them from position ``offset`` (a problem's id is its position,
        so it keeps its id and seed in any run). ``source``: ``"auto"`` (the shipped split), ``"sample"``
        (its first 20), a jsonl path (fields ``question`` and ``answer`` ending in ``#### <number>``), or
        ``"hub"`` (openai/gsm8k through ``datasets``)."""
        path = self.source_file(source, split)
        if path is None:
            import datasets

            try:
                items = list(datasets.load_dataset("openai/gsm8k", "main", split=split))
            except Exception as err:  # offline, no hub access, or not cached
                raise FileNotFoundError(
                    f"could not load openai/gsm8k from the hub ({type(err).__name__}: {err}); "
                    "pass --data PATH to a local jsonl, or --data auto for the shipped problems"
                ) from err
        else:
            items = read_jsonl(path, self.fields)
        if source == "sample":
            items = items[:SAMPLE_SIZE]
        rows = items[offset:] if limit is None else items[offset : offset + limit]
        return [Problem(offset + i, r["question"], r["answer"].split("####")[-1].strip().replace(",", ""), r["answer"])
                for i, r in enumerate(rows)]

    def messages(self, problem: Problem, template: str = "chat") -> list[dict]:
        """Chat messages asking ``problem``: zero-shot, or after worked train examples (few-shot)."""
        if template not in TEMPLATES:
            raise ValueError(f"unknown prompt template {template!r}; choose from {', '.join(TEMPLATES)}")
        shots = []
        if template == "fewshot":
            for ex in read_jsonl(DATA / "gsm8k_train_fewshot.jsonl", self.fields):
                shots += [{"role": "user", "content": f"{ex['question']}\n{INSTRUCTION}"},
                          {"role": "assistant", "content": worked_answer(ex["answer"])}]
        return shots + [{"role": "user", "content": f"{problem.question}\n{INSTRUCTION}"}]

    def prompt(self, tokenizer, problem: Problem, template: str = "chat") -> str:
        """The prompt text through the tokenizer's chat template."""
        return tokenizer.apply_chat_template(self.messages(problem, template), tokenize=False,
                                             add_generation_prompt=True)

    def worked_examples(self, tokenizer, source: str = "auto", limit: int | None = 200,
                        template: str = "chat") -> list[tuple[str, str]]:
        """(prompt, reference answer) text pairs from the train split, for teacher-forced calibration."""
        return [(self.prompt(tokenizer, p, template), worked_answer(p.solution))
                for p in self.load(source, limit, split="train")]


def worked_answer(solution: str) -> str:
    """A GSM8K reference solution in the answer format the prompt asks for."""
    body, _, final = solution.rpartition("####")
    return re.sub(r"<<[^>]*>>", "", body).strip() + f"\nFinal Answer: {final.strip()}"


BENCHMARKS = {b.name: b for b in (GSM8K(),)}


def get_benchmark(name: str):
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]
