"""Benchmarks as a small registry; GSM8K first, from a local jsonl, the hub, or the shipped sample."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
SHARED_DEV = SHARED / "test_dev.jsonl"
SHARED_TRAIN = SHARED / "train.jsonl"
INSTRUCTION = "Solve the problem step by step, then end with 'Final Answer: <number>'."
TEMPLATES = ("chat", "fewshot")


@dataclass(frozen=True)
class Problem:
    id: int
    question: str
    answer: str  # the gold final answer as written after '####'
    solution: str = ""


class GSM8K:
    """Grade-school maths word problems (Cobbe et al. 2021), graded on the final number."""

    name = "gsm8k"

    def load(self, source: str = "auto", limit: int | None = None, split: str = "test") -> list[Problem]:
        """Problems in file order. ``source``: a jsonl path, ``"hub"`` (openai/gsm8k via datasets),
        ``"sample"`` (20 test problems shipped with semverify), or ``"auto"`` (the shared file of
        ``split`` when present, else the hub for train and the sample for test)."""
        if source == "auto":
            shared = SHARED_TRAIN if split == "train" else SHARED_DEV
            source = str(shared) if shared.is_file() else ("hub" if split == "train" else "sample")
        if source == "hub":
            import datasets

            try:
                items = datasets.load_dataset("openai/gsm8k", "main", split=split)
            except Exception as err:  # offline, no hub access, or not cached
                raise FileNotFoundError(
                    f"could not load openai/gsm8k from the hub ({type(err).__name__}: {err}); "
                    "pass --data PATH to a local jsonl or --data sample"
                ) from err
        else:
            path = DATA / "gsm8k_test_sample.jsonl" if source == "sample" else Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"GSM8K data file not found: {path} (use --data PATH, 'hub' or 'sample')")
            items = [json.loads(line) for line in path.open() if line.strip()]
        rows = [item for i, item in enumerate(items) if limit is None or i < limit]
        return [Problem(i, r["question"], r["answer"].split("####")[-1].strip().replace(",", ""), r["answer"])
                for i, r in enumerate(rows)]

    def messages(self, problem: Problem, template: str = "chat") -> list[dict]:
        """Chat messages asking ``problem``: zero-shot, or after worked train examples (few-shot)."""
        if template not in TEMPLATES:
            raise ValueError(f"unknown prompt template {template!r}; choose from {', '.join(TEMPLATES)}")
        shots = []
        if template == "fewshot":
            for ex in map(json.loads, (DATA / "gsm8k_train_fewshot.jsonl").open()):
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
