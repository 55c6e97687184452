"""``semverify compare``: run several methods on the same problems, one JSONL row per (problem, method).

The target alone ("vanilla") runs in the same process on the same problems, so speedups are
same-run ratios. Killed at any point and rerun with the same command, a run keeps every finished
row and continues; under ``accelerate launch`` each process takes every n-th problem and writes its
own shard, which ``semverify report`` merges. What the rows depend on is checked and recorded in
``run.json`` (`evals.provenance`). A run is checked and built once (`CheckedRun`: the
benchmark's problems, the tokenizer, each method's rule) before any model loads, and then decoded.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from semverify import NoDrafter, SpecGenerateOutput, generate, load_model
from semverify.engine.clock import device_clock
from semverify.engine.coupling import CoupledNoise, mix
from semverify.machine import machine
from semverify.methods import Method, load_method_rules
from semverify.models import ModelLoadError, choose_dtype, load_tokenizer
from semverify.plugins import load_plugins, loaded_plugins
from semverify.registry import DraftResources, drafter_kind, make_drafter
from semverify.rules import BaseRule
from semverify.sense import Datastore

from .benchmarks import Benchmark, Problem, get_benchmark
from .provenance import RunSettings, pins, prepare_run, recorded
from .rows import RowWriter, read_rows, row_key


@dataclass(frozen=True)
class CheckedRun:
    """A run checked and built once, before any model loads, and handed to `compare`: its settings
    and methods, the benchmark and its problems, the target's tokenizer (None when it does not load: loading
    the target then says why), each method's rule, and the device the models run on (not a setting: rows
    record their machine, and rows of two machines never share a timing)."""

    settings: RunSettings
    methods: list[Method]
    benchmark: Benchmark
    problems: list[Problem]
    tokenizer: Any
    rules: dict[str, BaseRule]
    device: str = "cpu"

    @classmethod
    def build(cls, settings: RunSettings, methods: str | None, configs: list[str] | None = None,
              only: str | None = None, device: str = "cpu") -> "CheckedRun":
        """The run of ``settings`` with the methods of ``methods`` and ``configs`` (``only``: just those named),
        on ``device``, every input error raised here (after loading the plugins: `semverify.load_plugins`)."""
        load_plugins()  # the installed packages' semverify.plugins entry points and $SEMVERIFY_PLUGINS
        bench = get_benchmark(settings.benchmark)
        bench.check_template(settings.template)
        problems = bench.load(settings.data, settings.limit, offset=settings.offset or 0)
        if not problems:
            raise ValueError(f"--offset {settings.offset} is past the last problem of --data {settings.data}")
        try:
            tokenizer = load_tokenizer(settings.target)
        except ModelLoadError:
            tokenizer = None  # methods are checked without it; loading the target then reports the problem
        context = settings.context(tokenizer)  # rules that write prompts need the tokenizer
        loaded = load_method_rules(methods, configs, context, only)  # each rule built once, kept for the run
        chosen = [m for m, _ in loaded]
        unbatched = one_at_a_time(loaded) if (settings.batch_size or 1) > 1 else []
        if unbatched:
            raise ValueError(f"methods {', '.join(unbatched)} decode one problem at a time (a drafter of one "
                             "sequence, or a rule that asks the target more about each draft); run them without "
                             "--batch-size")
        storeless = [m.name for m in chosen if m.retrieves and m.datastore(settings.datastore) is None]
        if storeless:
            raise ValueError(f"methods {', '.join(storeless)} draft by retrieval and need --datastore FILE "
                             "(build one with `semverify datastore`) or their own drafter.datastore=FILE")
        refuse_int8_off_cpu([m.name for m in chosen if "draft_model_int8" in m.needs], device)
        for path in {m.datastore(settings.datastore) for m in chosen} - {None}:
            if not Path(path).is_file():
                raise FileNotFoundError(f"datastore not found: {path}")
        return cls(settings, chosen, bench, problems, tokenizer, {m.name: rule for m, rule in loaded}, device)


def one_at_a_time(loaded: list[tuple[Method, BaseRule]]) -> list[str]:
    """The methods that cannot decode a batch: their drafter drafts one sequence, or their rule asks the
    target more about each draft on one row's cache (specreason)."""
    return [m.name for m, rule in loaded if not drafter_kind(m.drafter).batches or rule.needs_extend]


def refuse_int8_off_cpu(int8_methods: list[str], device: str) -> None:
    """The int8 draft is PyTorch's CPU dynamic quantization: methods drafting with it run on the CPU only."""
    if int8_methods and torch.device(device).type != "cpu":
        raise ValueError(f"methods {', '.join(int8_methods)} draft with the int8 model, which runs on the CPU only; "
                         "use --device cpu or their plain versions")


def shard_info() -> tuple[int, int]:
    """(rank, world size) of this process: set by ``accelerate launch`` (and torchrun), else (0, 1).

    Shards only need the launcher's RANK/WORLD_SIZE, no process group: each process decodes its own
    problems, so ``accelerate launch --multi_gpu --num_processes N`` also shards on CPU-only machines.
    """
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def compare(run: CheckedRun, out: str | Path, repin: bool = False, records: dict | None = None,
            timed: bool = True) -> Path:
    """Run ``run``'s methods on its problems, appending rows to ``out``; returns the run folder
    (``repin``: resume although a method's pinned file changed, see `evals.provenance.prepare_run`; ``records``:
    choices to keep in run.json beside the dtypes; ``timed=False``: rows marked untimed, as accuracy mode's)."""
    out, settings = Path(out), run.settings
    rank, world = shard_info()
    out.mkdir(parents=True, exist_ok=True)
    with RowWriter(out / f"rows.rank{rank}.jsonl") as writer:  # locks the shard and cuts a torn last line first
        done = {row_key(r) for r in read_rows(out)}
        todo = [(Work(p, sample), m) for p in run.problems[rank::world] for sample in range(settings.samples or 1)
                for m in (run.methods if p.id % 2 == 0 else run.methods[::-1]) if (p.id, m.name, sample) not in done]
        pinned = pins(run.benchmark.source_file(settings.data), run.methods, run.rules, settings.datastore,
                      loaded_plugins())
        dtypes = None if rank else model_dtypes(run, out)  # rank 0 chooses; the others read its choice
        prepare_run(out, settings, run.methods, pinned, {m.name for _, m in todo}, rank, repin,
                    None if rank else {"dtypes": dtypes, **(records or {})})
        if todo:
            _run(run, todo, writer, rank, world, dtypes or model_dtypes(run, out), timed)
    return out


def model_dtypes(run: CheckedRun, out: Path) -> dict:
    """The dtype per role ("target", "draft") the run's models load in: ``--dtype`` itself, or for ``fastest``
    the choice made when the run started (`semverify.models.choose_dtype`), which its ``run.json`` keeps for
    every resume so that all rows of a run share their dtypes; the choice says why, in seconds per token."""
    chosen = recorded(out, "dtypes")
    if chosen is not None:
        return chosen
    settings = run.settings
    if settings.dtype != "fastest":
        return {"target": settings.dtype, "draft": settings.dtype}
    choices = {role: choose_dtype(name, role, run.device) for role, name in (("target", settings.target),
                                                                              ("draft", settings.draft))}
    for choice in choices.values():
        print(f"semverify compare: --dtype fastest: {choice.summary()}", file=sys.stderr)
    return {**{role: str(c.dtype).removeprefix("torch.") for role, c in choices.items()},
            "why": {role: c.to_dict() for role, c in choices.items()}}


@dataclass(frozen=True)
class Work:
    """One output to decode: a problem, and which of its samples (0 unless ``--samples``)."""

    problem: Problem
    sample: int = 0


def problem_seed(settings: RunSettings, work: Work) -> int:
    """The seed of one sample of a problem, the same for every method (so their rows pair)."""
    seed = settings.seed * 1_000_003 + work.problem.id
    return seed if work.sample == 0 else mix(seed, work.sample)


def _run(run: CheckedRun, todo: list[tuple[Work, Method]], writer: RowWriter, rank: int, world: int,
         dtypes: dict, timed: bool) -> None:
    settings, bench, tokenizer = run.settings, run.benchmark, run.tokenizer
    target, _ = load_model(settings.target, dtype=dtypes["target"], device=run.device)
    needs = set().union(*(m.needs for m in run.methods))
    resources = DraftResources(
        draft_model=load_model(settings.draft, dtype=dtypes["draft"], device=run.device)[0]
        if "draft_model" in needs else None,
        draft_model_int8=load_model(settings.draft, quantize="int8")[0] if "draft_model_int8" in needs else None,
        target_model=target, tokenizer=tokenizer, eos_token_id=target.generation_config.eos_token_id)
    stores = {path: load_datastore(path, settings.target, target)
              for path in {m.datastore(settings.datastore) for m in run.methods} - {None}}
    live: dict[str, list] = {}
    started = time.perf_counter()
    with tqdm(total=len(todo), desc=f"compare[{rank}]" if world > 1 else "compare", unit="run") as bar:
        for work, method in batches(todo, settings.batch_size or 1):  # a stop closes the bar before its line
            own = replace(resources, datastore=stores.get(method.datastore(settings.datastore)))
            for row in run_batch(work, method, run.rules[method.name], settings, target, tokenizer, own, bench):
                writer.write(row if timed else {**row, "timed": False})
                acc, taus = live.setdefault(method.name, [[], []])
                acc.append(row["grades"][bench.main_grader])
                taus.append(row["tau"])
            bar.update(len(work))
            per_hour = bar.n * 3600 / max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(f"{per_hour:.0f} outputs/h " + " ".join(
                f"{n}: acc={sum(a) / len(a):.2f} tau={sum(t) / len(t):.2f}" for n, (a, t) in live.items()))


def batches(todo: list[tuple[Work, Method]], size: int) -> list[tuple[list[Work], Method]]:
    """The (work, method) pairs as batches of up to ``size`` outputs of one method, in the order of
    the pairs' first outputs: with ``size`` 1, exactly the pairs (methods alternate per problem)."""
    out: list[tuple[list[Work], Method]] = []
    open_batch: dict[str, list[Work]] = {}
    for problem, method in todo:
        group = open_batch.get(method.name)
        if group is None or len(group) == size:
            group = open_batch[method.name] = []
            out.append((group, method))
        group.append(problem)
    return out


def load_datastore(path: str, target_name: str, target) -> Datastore:
    """A retrieval method's datastore, checked against the target."""
    store = Datastore.load(path)
    store.check_model(target_name, target.config.get_text_config().hidden_size)
    return store


def run_batch(work: list[Work], method: Method, rule, settings: RunSettings, target, tokenizer,
              resources: DraftResources, bench) -> list[dict]:
    """Decode ``work`` (problems, or samples of them) with one method in one left-padded batch and grade
    each; returns their JSONL rows. Each output draws from its own seeded stream, so its row is the same
    in any batch."""
    problems = [w.problem for w in work]
    texts = [bench.prompt(tokenizer, p, settings.template) for p in problems]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids, mask = (t.to(target.device) for t in left_pad([tokenizer(t).input_ids for t in texts], pad))
    width = ids.shape[1]
    seeds = [problem_seed(settings, w) for w in work]  # the same draws for every method on a problem
    streams = [CoupledNoise(seed, context=settings.coupled_context, noise=settings.coupled_noise or "legacy")
               if settings.coupled
               else torch.Generator(target.device).manual_seed(seed)
               for seed in seeds]
    kwargs = dict(max_new_tokens=settings.max_new_tokens, do_sample=settings.do_sample,
                  generator=streams[0] if len(problems) == 1 else streams, tokenizer=tokenizer,
                  attention_mask=mask if len(problems) > 1 else None, pad_token_id=pad)
    if settings.do_sample:
        kwargs.update(temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p or 1.0)
    clock = device_clock(target.device)
    started = clock()
    result = decode(method, rule, target, resources, ids, **kwargs)
    wall = clock() - started
    row_stats = result.spec_stats.rows or [result.spec_stats]
    batch = ({"first": problems[0].id, "size": len(problems), "wall": wall, "tokens": result.spec_stats.new_tokens}
             if len(problems) > 1 else None)
    return [{**problem_row(w.problem, method, seed, result.sequences[i, width : width + stats.new_tokens], stats,
                           tokenizer, batch, bench, settings.max_new_tokens), "sample": w.sample}
            for i, (w, seed, stats) in enumerate(zip(work, seeds, row_stats))]


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Token ids of several prompts as one left-padded batch, and its attention mask."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def decode(method: Method, rule: BaseRule, target, resources: DraftResources, ids: torch.LongTensor,
           **kwargs) -> SpecGenerateOutput:
    """One method's ``generate()`` call: the target verifying the method's drafter with ``rule``, or the draft
    model alone (``decoder="draft"``); ``kwargs`` go to ``generate()``."""
    if method.decoder == "draft":
        model, drafter = resources.draft_model, NoDrafter()
    else:
        model, drafter = target, make_drafter(method.drafter, resources, method.k, **method.drafter_settings)
    return generate(model, ids, drafter=drafter, rule=rule, num_assistant_tokens=method.k,
                    return_dict_in_generate=True, **kwargs)


def problem_row(problem: Problem, method: Method, seed: int, new: torch.LongTensor, stats, tokenizer,
                batch: dict | None, bench, cap: int) -> dict:
    """One problem's JSONL row: output, grades (an output of ``cap`` tokens was cut off) and statistics (and
    its batch's size, wall time and tokens)."""
    text = tokenizer.decode(new, skip_special_tokens=True)
    row = {
        "id": problem.id, "method": method.name, "seed": seed, "gold": problem.answer, "output": text,
        "output_ids": new.tolist(),
        "grades": bench.grade_output(text, problem, capped=len(new) >= cap), "new_tokens": len(new),
        "steps": stats.steps,
        "drafted": stats.drafted, "accepted": stats.accepted, "tau": stats.tau, "alpha": stats.alpha,
        "accept_lengths": stats.accept_lengths, "draft_lengths": stats.draft_lengths,
        "drafted_per_position": stats.drafted_per_position,
        "accepted_per_position": stats.accepted_per_position, "reasons": dict(stats.reasons),
        "reasons_per_position": stats.reasons_per_position, "scores": stats.scores,
        "substitutions": [{"at": at, "reason": why, "kept": tokenizer.decode([kept]), "target": tokenizer.decode([own])}
                          for at, why, kept, own in stats.substitutions],
        "draft_time": stats.draft_time, "verify_time": stats.verify_time, "total_time": stats.total_time,
        "tok_s": stats.tokens_per_second, "machine": machine(new.device),
    }
    if problem.meta:
        row["meta"] = problem.meta
    if batch is not None:
        row["batch"] = batch
    return row
