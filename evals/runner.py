"""``semverify compare``: run several methods on the same problems, one JSONL row per (problem, method).

The target alone ("vanilla") runs in the same process on the same problems, so speedups are
same-run ratios. Killed at any point and rerun with the same command, a run keeps every finished
row and continues; under ``accelerate launch`` each process takes every n-th problem and writes
its own shard, which ``semverify report`` merges.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from semverify import NoDrafter, PromptLookupDrafter, generate, load_model
from semverify.semanticspec import StepDrafter, StepSegmenter
from semverify.sense import Datastore, RetrievalDrafter

from .benchmarks import Problem, get_benchmark
from .env import cpu_name, environment
from .grading import grade
from .methods import RETRIEVAL, Method
from .rows import RowWriter, read_rows


@dataclass(frozen=True)
class RunSettings:
    """Everything that decides a row's content; a resumed run must match it exactly."""

    target: str
    draft: str
    dtype: str = "bfloat16"
    benchmark: str = "gsm8k"
    data: str = "auto"
    template: str = "chat"
    limit: int | None = 50
    max_new_tokens: int = 256
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    datastore: str | None = None  # retrieval drafters' datastore file (semverify datastore)


def shard_info() -> tuple[int, int]:
    """(rank, world size) of this process: set by ``accelerate launch`` (and torchrun), else (0, 1).

    Shards only need the launcher's RANK/WORLD_SIZE, no process group: each process decodes its own
    problems, so ``accelerate launch --multi_gpu --num_processes N`` also shards on CPU-only machines.
    """
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def prepare_run(out: Path, settings: RunSettings, methods: list[Method]) -> None:
    """Write run.json, or check that an existing one has the same settings. Methods the run does not
    have yet are added to it (same problems and seeds, so they pair with the rows already there); a
    method whose name is in the run with another definition is refused. Each resume records its
    environment (code version included) under ``resumed``."""
    spec = {"settings": asdict(settings), "methods": [m.to_dict() for m in methods]}
    path = out / "run.json"
    if path.exists():
        old = json.loads(path.read_text())
        # settings added to semverify after a run started are unset (None) in its resume
        new_unset = {k for k, v in spec["settings"].items() if v is None and k not in old["settings"]}
        current = {k: v for k, v in spec["settings"].items() if k not in new_unset}
        known = {m["name"]: m for m in old["methods"]}
        changed = [m["name"] for m in spec["methods"] if m["name"] in known and known[m["name"]] != m]
        if old["settings"] != current or changed:
            what = f"other definitions of {', '.join(changed)}" if changed else "other settings"
            raise ValueError(f"{out} holds a run with {what}; resume it with the same settings or choose a new --out")
        added = [m for m in spec["methods"] if m["name"] not in known]
        if added:
            old["methods"] += added
            old.setdefault("added", []).append({"methods": [m["name"] for m in added],
                                                "environment": environment(**asdict(settings))})
        else:
            old.setdefault("resumed", []).append(environment(**asdict(settings)))
        _write_json(path, old)
        return
    out.mkdir(parents=True, exist_ok=True)
    _write_json(path, {**spec, "environment": environment(**asdict(settings))})


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def compare(settings: RunSettings, methods: list[Method], out: str | Path) -> Path:
    """Run ``methods`` on the benchmark's problems, appending rows to ``out``; returns the run folder."""
    out = Path(out)
    bench = get_benchmark(settings.benchmark)
    problems = bench.load(settings.data, settings.limit)  # a missing data file fails before any model loads
    rank, world = shard_info()
    if rank == 0:
        prepare_run(out, settings, methods)
    mine = problems[rank::world]
    done = {(r["id"], r["method"]) for r in read_rows(out)}
    todo = [(p, m) for p in mine for m in (methods if p.id % 2 == 0 else methods[::-1]) if (p.id, m.name) not in done]
    if not todo:
        return out

    target, tokenizer = load_model(settings.target, dtype=settings.dtype)
    drafts = {}
    if any(m.drafter in ("model", "step") or m.decoder == "draft" for m in methods):
        drafts["model"] = load_model(settings.draft, dtype=settings.dtype)[0]
    if any(m.drafter == "model_int8" for m in methods):
        drafts["model_int8"] = load_model(settings.draft, quantize="int8")[0]
    for path in {m.datastore(settings.datastore) for m in methods if m.drafter in RETRIEVAL}:
        drafts[("datastore", path)] = load_datastore(path, settings.target, target)

    writer = RowWriter(out / f"rows.rank{rank}.jsonl")
    live: dict[str, list] = {}
    bar = tqdm(todo, desc=f"compare[{rank}]" if world > 1 else "compare", unit="run")
    try:
        for problem, method in bar:
            row = run_one(problem, method, settings, target, tokenizer, drafts, bench)
            writer.write(row)
            acc, taus = live.setdefault(method.name, [[], []])
            acc.append(row["grades"]["math_verify"])
            taus.append(row["tau"])
            bar.set_postfix_str(" ".join(f"{n}: acc={sum(a) / len(a):.2f} tau={sum(t) / len(t):.2f}"
                                         for n, (a, t) in live.items()))
    finally:
        writer.close()
    return out


def load_datastore(path: str | None, target_name: str, target) -> Datastore | None:
    """The datastore for retrieval drafters, checked against the target (None: context lookup only)."""
    if path is None:
        return None
    store = Datastore.load(path)
    store.check_model(target_name, target.config.get_text_config().hidden_size)
    return store


def run_one(problem: Problem, method: Method, settings: RunSettings, target, tokenizer, drafts, bench) -> dict:
    """Decode one problem with one method and grade it; returns the JSONL row."""
    ids = tokenizer(bench.prompt(tokenizer, problem, settings.template), return_tensors="pt").input_ids
    seed = settings.seed * 1_000_003 + problem.id  # the same draws for every method on a problem
    kwargs = dict(max_new_tokens=settings.max_new_tokens, do_sample=settings.do_sample,
                  return_dict_in_generate=True, generator=torch.Generator().manual_seed(seed),
                  acceptance=method.build_rule(), num_assistant_tokens=method.k)
    if settings.do_sample:
        kwargs.update(temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p or 1.0)
    if method.drafter == "prompt_lookup":
        kwargs["drafter"] = PromptLookupDrafter(eos_token_id=target.generation_config.eos_token_id)
    elif method.drafter == "none":
        kwargs["drafter"] = NoDrafter()
    elif method.drafter == "step":
        kwargs["drafter"] = StepDrafter(drafts["model"], StepSegmenter(tokenizer, max_step_tokens=method.k))
    elif method.drafter in RETRIEVAL:
        kwargs["drafter"] = RetrievalDrafter(drafts[("datastore", method.datastore(settings.datastore))],
                                             **RETRIEVAL[method.drafter], **method.drafter_settings)
    else:
        kwargs["assistant_model"] = drafts[method.drafter]
    result = generate(drafts["model"] if method.decoder == "draft" else target, ids, **kwargs)
    new = result.sequences[0, ids.shape[1]:]
    text = tokenizer.decode(new, skip_special_tokens=True)
    stats = result.spec_stats
    return {
        "id": problem.id, "method": method.name, "seed": seed, "gold": problem.answer, "output": text,
        "output_ids": new.tolist(),
        "grades": grade(text, problem.answer), "new_tokens": len(new), "steps": stats.steps,
        "drafted": stats.drafted, "accepted": stats.accepted, "tau": stats.tau, "alpha": stats.alpha,
        "accept_lengths": stats.accept_lengths, "drafted_per_position": stats.drafted_per_position,
        "accepted_per_position": stats.accepted_per_position, "reasons": dict(stats.reasons),
        "reasons_per_position": stats.reasons_per_position, "scores": stats.scores,
        "draft_time": stats.draft_time, "verify_time": stats.verify_time, "total_time": stats.total_time,
        "tok_s": stats.tokens_per_second, "machine": cpu_name(),
    }
