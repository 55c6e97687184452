"""lm-evaluation-harness tasks over the data shipped with semverify, so ``semverify lm-eval`` works offline.

``semverify_gsm8k`` asks the shipped GSM8K dev problems (few-shot examples from the shipped train split)
and scores exact match of the strict ("Final Answer:", \\boxed{} or "####") and flexible (last number)
readings, as semverify's own graders do; ``semverify_math500`` asks MATH-500 and scores Math-Verify
against the gold LaTeX answer. The YAML files are written into a folder given to lm-eval as
``--include_path``; they name the data files by absolute path.
"""

from __future__ import annotations

import json
from pathlib import Path

from .benchmarks import DEV, INSTRUCTION, MATH500_FILE, MATH_INSTRUCTION, TRAIN

TASKS = ("semverify_gsm8k", "semverify_math500")

PROCESS = '''"""Scoring for semverify's offline lm-eval tasks (written by evals/lm_eval_tasks.py)."""

from evals.grading import extract_flexible, extract_strict, grade_math, normalize_number


def gsm8k(doc, results):
    gold = normalize_number(doc["answer"].split("####")[-1])
    return {"strict_match": float(extract_strict(results[0]) == gold),
            "flexible_match": float(extract_flexible(results[0]) == gold)}


def math500(doc, results):
    return {"math_verify": float(grade_math(results[0], doc["answer"])["math_verify"])}
'''


def gsm8k_task() -> dict:
    return {
        "task": "semverify_gsm8k", "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(DEV), "train": str(TRAIN)}},
        "output_type": "generate_until", "test_split": "test", "fewshot_split": "train", "num_fewshot": 0,
        "doc_to_text": "Question: {{question}}\n" + INSTRUCTION + "\nAnswer:",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["Question:", "</s>", "<|im_end|>"], "do_sample": False, "max_gen_toks": 384},
        "process_results": "!function semverify_process.gsm8k",
        "metric_list": [{"metric": "strict_match", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "flexible_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }


def math500_task() -> dict:
    return {
        "task": "semverify_math500", "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(MATH500_FILE)}},
        "output_type": "generate_until", "test_split": "test", "num_fewshot": 0,
        "doc_to_text": "Problem: {{problem}}\n" + MATH_INSTRUCTION + "\nSolution:",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["Problem:", "</s>", "<|im_end|>"], "do_sample": False, "max_gen_toks": 1024},
        "process_results": "!function semverify_process.math500",
        "metric_list": [{"metric": "math_verify", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }


def write_tasks(folder: str | Path) -> Path:
    """Write the task YAMLs and their scoring module into ``folder``; returns it (for ``--include_path``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "semverify_process.py").write_text(PROCESS)
    for task in (gsm8k_task(), math500_task()):
        process = task.pop("process_results")
        lines = [f"{key}: {json.dumps(value)}" for key, value in task.items()]  # JSON values are valid YAML
        lines.append(f"process_results: {process}")
        (folder / f"{task['task']}.yaml").write_text("\n".join(lines) + "\n")
    return folder
