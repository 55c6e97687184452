"""Benchmarks as a small protocol: load problems, write the prompt's messages, grade an output.

Each benchmark reads the data shipped with semverify (``evals/data``, licences beside it), a local
jsonl file, or its hub id through ``datasets``; nothing is read from outside the package.

- GSM8K (MIT): the train split (7,473 problems; calibration, datastores, probes and few-shot prompts use
  it) and the first 500 problems of the test split (the dev problems every committed run uses; ``sample``
  is their first 20).
- MATH-500 (MIT): the 500 MATH test problems of "Let's Verify Step by Step", graded with Math-Verify
  against the gold LaTeX answer, with accuracy per subject and level in the report.
- HumanEval (MIT): 164 Python functions to write from a signature and docstring, graded pass@1 by
  running the answer's code against the problem's tests in a sandboxed process.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from semverify.registry import closest

from .grading import CODE_GRADERS, GRADERS, MATH_GRADERS, extract_strict, grade, grade_code, grade_math, last_boxed

DATA = Path(__file__).parent / "data"
TRAIN = DATA / "gsm8k_train.jsonl.gz"
DEV = DATA / "gsm8k_test_dev.jsonl"
MATH500_FILE = DATA / "math500_test.jsonl"
HUMANEVAL_FILE = DATA / "humaneval.jsonl.gz"
SAMPLE_SIZE = 20
INSTRUCTION = "Solve the problem step by step, then end with 'Final Answer: <number>'."
MATH_INSTRUCTION = "Solve the problem step by step, and put your final answer within \\boxed{}."
CODE_INSTRUCTION = "Complete the following Python function. Write the whole function in one ```python code block."


@dataclass(frozen=True)
class Problem:
    id: int
    question: str
    answer: str  # the gold final answer
    solution: str = ""
    meta: dict = field(default_factory=dict)  # what accuracy is broken down by (MATH-500: subject, level)
    tests: str = ""  # what grading runs (HumanEval: the check function); not stored in rows


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


class Benchmark:
    """Loading, prompts and grading of one benchmark; subclasses fill in the specifics."""

    name = ""
    title = ""  # as people write it
    fields: tuple[str, ...] = ()  # what every data row must have
    hub: tuple[str, str | None] = ("", None)  # dataset id and config for ``--data hub``
    templates: tuple[str, ...] = ("chat",)
    graders: tuple[str, ...] = ()
    main_grader = ""  # the grade paired tests, plots and sweeps use unless told otherwise
    groups: tuple[str, ...] = ()  # problem meta keys the report breaks accuracy down by
    text_graded = True  # grading needs only an output's text and the gold answer, so a report can regrade rows

    def shipped(self, split: str) -> Path:
        raise ValueError(f"{self.title} ships no {split} split; pass --data PATH or 'hub'")

    def source_file(self, source: str, split: str = "test") -> Path | None:
        """The file ``source`` reads (None for the hub): ``auto`` and ``sample`` are the shipped files."""
        if source == "hub":
            return None
        if source in ("auto", "sample"):
            return self.shipped(split)
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"{self.title} data file not found: {path} (use --data PATH, 'auto', 'sample' "
                                    "or 'hub')")
        return path

    def load(self, source: str = "auto", limit: int | None = None, split: str = "test",
             offset: int = 0) -> list[Problem]:
        """Problems in file order, ``limit`` of them from position ``offset`` (a problem's id is its position,
        so it keeps its id and seed in any run). ``source``: ``"auto"`` (shipped), ``"sample"`` (its first
        20), a jsonl path, or ``"hub"`` (through ``datasets``)."""
        path = self.source_file(source, split)
        items = read_jsonl(path, self.fields) if path is not None else self._hub(split)
        if source == "sample":
            items = items[:SAMPLE_SIZE]
        rows = items[offset:] if limit is None else items[offset : offset + limit]
        return [self.problem(offset + i, row) for i, row in enumerate(rows)]

    def _hub(self, split: str) -> list[dict]:
        import datasets

        name, config = self.hub
        try:
            return list(datasets.load_dataset(name, config, split=split))
        except Exception as err:  # offline, no hub access, or not cached
            raise FileNotFoundError(f"could not load {name} from the hub ({type(err).__name__}: {err}); pass "
                                    "--data PATH to a local jsonl, or --data auto for the shipped problems") from err

    def problem(self, i: int, row: dict) -> Problem:
        raise NotImplementedError

    def messages(self, problem: Problem, template: str = "chat") -> list[dict]:
        raise NotImplementedError

    def check_template(self, template: str) -> None:
        if template not in self.templates:
            raise ValueError(f"unknown prompt template {template!r} for {self.name}; choose from "
                             f"{', '.join(self.templates)}")

    def prompt(self, tokenizer, problem: Problem, template: str = "chat") -> str:
        """The prompt text through the tokenizer's chat template."""
        return tokenizer.apply_chat_template(self.messages(problem, template), tokenize=False,
                                             add_generation_prompt=True)

    def grade(self, output: str, problem: Problem) -> dict[str, bool]:
        raise NotImplementedError

    def answered(self, output: str) -> bool:
        """Whether ``output`` states its final answer explicitly (the marker its strict grader reads)."""
        return True

    def grade_output(self, output: str, problem: Problem, capped: bool) -> dict[str, bool]:
        """Every grade of ``output``, with `cut_at_cap` applied."""
        return self.cut_at_cap(self.grade(output, problem), output, capped)

    def cut_at_cap(self, grades: dict[str, bool], output: str, capped: bool) -> dict[str, bool]:
        """``grades`` of an output, except that one cut off at the token cap (``capped``) without an explicit
        final answer is no answer under every grader, so a last number reached mid-reasoning never scores."""
        return dict.fromkeys(grades, False) if capped and not self.answered(output) else grades

    def regrade(self, row: dict, cap: int | None = None) -> dict:
        """A run row with its grades from today's graders (``cap``: the run's max_new_tokens), so rows written
        before a grader changed compare fairly with newer ones; benchmarks whose grading needs more than the
        row holds keep the stored grades."""
        if not self.text_graded:
            return row
        capped = cap is not None and row.get("new_tokens", 0) >= cap
        return {**row, "grades": self.grade_output(row["output"], Problem(row["id"], "", row["gold"]), capped)}


class GSM8K(Benchmark):
    """Grade-school maths word problems (Cobbe et al. 2021), graded on the final number."""

    name, title = "gsm8k", "GSM8K"
    fields = ("question", "answer")
    hub = ("openai/gsm8k", "main")
    templates = ("chat", "fewshot")
    graders, main_grader = GRADERS, "math_verify"

    def shipped(self, split: str) -> Path:
        return TRAIN if split == "train" else DEV

    def problem(self, i: int, row: dict) -> Problem:
        return Problem(i, row["question"], row["answer"].split("####")[-1].strip().replace(",", ""), row["answer"])

    def messages(self, problem: Problem, template: str = "chat") -> list[dict]:
        """Chat messages asking ``problem``: zero-shot, or after worked train examples (few-shot)."""
        self.check_template(template)
        shots = []
        if template == "fewshot":
            for ex in read_jsonl(DATA / "gsm8k_train_fewshot.jsonl", self.fields):
                shots += [{"role": "user", "content": f"{ex['question']}\n{INSTRUCTION}"},
                          {"role": "assistant", "content": worked_answer(ex["answer"])}]
        return shots + [{"role": "user", "content": f"{problem.question}\n{INSTRUCTION}"}]

    def grade(self, output: str, problem: Problem) -> dict[str, bool]:
        return grade(output, problem.answer)

    def answered(self, output: str) -> bool:
        return extract_strict(output) is not None

    def worked_examples(self, tokenizer, source: str = "auto", limit: int | None = 200,
                        template: str = "chat") -> list[tuple[str, str]]:
        """(prompt, reference answer) text pairs from the train split, for teacher-forced calibration."""
        return [(self.prompt(tokenizer, p, template), worked_answer(p.solution))
                for p in self.load(source, limit, split="train")]


class MATH500(Benchmark):
    """MATH-500: competition maths (Hendrycks et al. 2021) in the 500-problem test subset of Lightman et
    al. 2023, graded on the boxed final answer against the gold LaTeX."""

    name, title = "math500", "MATH-500"
    fields = ("problem", "answer")
    hub = ("HuggingFaceH4/MATH-500", None)
    graders, main_grader = MATH_GRADERS, "math_verify"
    groups = ("subject", "level")

    def shipped(self, split: str) -> Path:
        if split != "test":
            raise ValueError("MATH-500 has a test split only")
        return MATH500_FILE

    def problem(self, i: int, row: dict) -> Problem:
        meta = {k: row[k] for k in ("subject", "level", "unique_id") if k in row}
        return Problem(i, row["problem"], row["answer"], row.get("solution", ""), meta)

    def messages(self, problem: Problem, template: str = "chat") -> list[dict]:
        """Zero-shot chat messages asking for the final answer in \\boxed{}."""
        self.check_template(template)
        return [{"role": "user", "content": f"{problem.question}\n{MATH_INSTRUCTION}"}]

    def grade(self, output: str, problem: Problem) -> dict[str, bool]:
        return grade_math(output, problem.answer)

    def answered(self, output: str) -> bool:
        return last_boxed(output) is not None


class HumanEval(Benchmark):
    """HumanEval (Chen et al. 2021): write a Python function from its signature and docstring; pass@1 runs
    the answer's code against the problem's tests in a sandboxed process (`evals.code_exec`)."""

    name, title = "humaneval", "HumanEval"
    fields = ("task_id", "prompt", "test", "entry_point")
    hub = ("openai_humaneval", None)
    graders, main_grader = CODE_GRADERS, "pass@1"
    text_graded = False  # pass@1 runs the problem's tests, which rows do not store

    def shipped(self, split: str) -> Path:
        if split != "test":
            raise ValueError("HumanEval has a test split only")
        return HUMANEVAL_FILE

    def problem(self, i: int, row: dict) -> Problem:
        return Problem(i, row["prompt"], row["entry_point"], row.get("canonical_solution", ""),
                       {"task_id": row["task_id"]}, row["test"])

    def messages(self, problem: Problem, template: str = "chat") -> list[dict]:
        """Zero-shot chat messages asking for the whole function in a code block."""
        self.check_template(template)
        return [{"role": "user", "content": f"{CODE_INSTRUCTION}\n\n```python\n{problem.question}```"}]

    def grade(self, output: str, problem: Problem) -> dict[str, bool]:
        return grade_code(output, problem.question, problem.tests, problem.answer)


def worked_answer(solution: str) -> str:
    """A GSM8K reference solution in the answer format the prompt asks for."""
    body, _, final = solution.rpartition("####")
    return re.sub(r"<<[^>]*>>", "", body).strip() + f"\nFinal Answer: {final.strip()}"


BENCHMARKS = {b.name: b for b in (GSM8K(), MATH500(), HumanEval())}


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}{closest(name, BENCHMARKS)}; available: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]
