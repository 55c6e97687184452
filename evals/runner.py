"""``semverify compare``: run several methods on the same problems, one JSONL row per (problem, method).

The target alone ("vanilla") runs in the same process on the same problems, so speedups are
same-run ratios. Killed at any point and rerun with the same command, a run keeps every finished
row and continues; under ``accelerate launch`` each process takes every n-th problem and writes its
own shard, which ``semverify report`` merges. ``run.json`` holds the settings, the methods, and the
content hashes of the files the rows depend on (data, datastores, probes, calibrations): a resume
with other settings, another definition of a method, or a changed file is refused, on every shard.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from semverify import NoDrafter, generate, load_model
from semverify.coupling import CoupledNoise, mix
from semverify.models import load_tokenizer
from semverify.registry import DraftResources, Method, RunContext, make_drafter
from semverify.sense import Datastore

from .benchmarks import Problem, get_benchmark
from .env import code_version, environment, machine
from .rows import RowWriter, read_rows, row_key


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
    offset: int | None = None  # problems from this position on (None: from the first; runs before it resume)
    batch_size: int | None = None  # problems decoded together per method (None: one at a time)
    coupled: bool | None = None  # sampled runs: coupled Gumbel noise per (problem, position) (None: torch streams)
    samples: int | None = None  # sampled runs: outputs per problem and method (None: one)

    def context(self, tokenizer=None) -> RunContext:
        return RunContext.for_decoding(self.draft, self.target, self.do_sample, self.temperature, tokenizer)


def shard_info() -> tuple[int, int]:
    """(rank, world size) of this process: set by ``accelerate launch`` (and torchrun), else (0, 1).

    Shards only need the launcher's RANK/WORLD_SIZE, no process group: each process decodes its own
    problems, so ``accelerate launch --multi_gpu --num_processes N`` also shards on CPU-only machines.
    """
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


_HASHES: dict[tuple, str] = {}


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's content (remembered per path, size and mtime within a process)."""
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def pins(settings: RunSettings, methods: list[Method], context: RunContext) -> dict:
    """Content hashes of what the rows depend on: the data file, and per method its datastore and the
    files its rule was built from (probes, calibrations)."""
    data = get_benchmark(settings.benchmark).source_file(settings.data)
    per_method = {}
    for m in methods:
        files = [*getattr(m.build_rule(context), "artifacts", ()), m.datastore(settings.datastore)]
        per_method[m.name] = {str(f): file_sha256(f) for f in files if f is not None}
    return {"data": {str(data): file_sha256(data)} if data is not None else {}, "methods": per_method}


def prepare_run(out: Path, settings: RunSettings, methods: list[Method], pinned: dict, pending: set[str],
                rank: int = 0, repin: bool = False) -> None:
    """Check this run against the folder's ``run.json``; rank 0 writes it (new folder) or records the
    resume. Refused: other settings, another definition of a method the run has, and a file whose
    content changed, for the data or for a method in ``pending`` (with problems left to run); with
    ``repin`` a method's changed file (a datastore rebuilt on another machine) is accepted and recorded.
    Methods the run does not have yet are added (same problems and seeds, so they pair with the rows)."""
    path = out / "run.json"
    if rank != 0:  # shards check against what rank 0 wrote
        for _ in range(600):
            if path.exists():
                break
            time.sleep(0.1)
        else:
            raise ValueError(f"{path} did not appear: the rank-0 process of this run has not started it")
    spec = {"settings": asdict(settings), "methods": [m.to_dict() for m in methods]}
    if not path.exists():
        _write_json(path, {**spec, "pins": pinned, "environment": environment(**asdict(settings))})
        return
    old = json.loads(path.read_text())
    # settings added to semverify after a run started are unset (None) in its resume
    current = {k: v for k, v in spec["settings"].items() if not (v is None and k not in old["settings"])}
    known = {m["name"]: Method.from_record(m).to_dict() for m in old["methods"]}
    changed = [m["name"] for m in spec["methods"] if m["name"] in known and known[m["name"]] != m]
    if old["settings"] != current or changed:
        what = f"other definitions of {', '.join(changed)}" if changed else "other settings"
        raise ValueError(f"{out} holds a run with {what}; resume it with the same settings or choose a new --out")
    before = old.get("pins", {"data": {}, "methods": {}})
    checked = [("the data", before["data"], pinned["data"])] + [
        (f"method {name!r}", before["methods"].get(name, {}), pinned["methods"].get(name, {})) for name in pending]
    moved = [{"file": file, "for": who, "then": then[file], "now": digest}
             for who, then, now in checked for file, digest in now.items() if then.get(file, digest) != digest]
    for change in moved:
        if not repin or change["for"] == "the data":
            hint = "" if change["for"] == "the data" else ", or pass --repin to go on with the new file"
            raise ValueError(f"{change['file']} ({change['for']}) changed since this run started (sha256 "
                             f"{change['then'][:12]}... then, {change['now'][:12]}... now); restore it{hint} "
                             "or start a new --out")
    if rank != 0:
        return
    if moved:
        print(f"semverify compare: --repin: going on with {len(moved)} changed file(s), recorded in {path}",
              file=sys.stderr)
        old.setdefault("repinned", []).append({"files": moved, "environment": environment(**asdict(settings))})
    if old.get("environment", {}).get("code") != (code := code_version()):
        print(f"semverify compare: resuming {out}, started with code {old.get('environment', {}).get('code')}, "
              f"with code {code}", file=sys.stderr)
    old["pins"] = {"data": {**before["data"], **pinned["data"]},
                   "methods": {**before["methods"], **pinned["methods"]}}
    added = [m for m in spec["methods"] if m["name"] not in known]
    if added:
        old["methods"] += added
        old.setdefault("added", []).append({"methods": [m["name"] for m in added],
                                            "environment": environment(**asdict(settings))})
    else:
        old.setdefault("resumed", []).append(environment(**asdict(settings)))
    _write_json(path, old)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def compare(settings: RunSettings, methods: list[Method], out: str | Path, repin: bool = False) -> Path:
    """Run ``methods`` on the benchmark's problems, appending rows to ``out``; returns the run folder
    (``repin``: resume although a method's pinned file changed, see ``prepare_run``)."""
    out = Path(out)
    bench = get_benchmark(settings.benchmark)
    problems = bench.load(settings.data, settings.limit, offset=settings.offset or 0)  # fails before models load
    rank, world = shard_info()
    out.mkdir(parents=True, exist_ok=True)
    context = settings.context(load_tokenizer(settings.target))  # rules that write prompts need it
    with RowWriter(out / f"rows.rank{rank}.jsonl") as writer:  # locks the shard and cuts a torn last line first
        done = {row_key(r) for r in read_rows(out)}
        mine = problems[rank::world]
        todo = [(Work(p, sample), m) for p in mine for sample in range(settings.samples or 1)
                for m in (methods if p.id % 2 == 0 else methods[::-1]) if (p.id, m.name, sample) not in done]
        prepare_run(out, settings, methods, pins(settings, methods, context), {m.name for _, m in todo}, rank,
                    repin)
        if todo:
            _run(settings, methods, todo, bench, writer, rank, world)
    return out


@dataclass(frozen=True)
class Work:
    """One output to decode: a problem, and which of its samples (0 unless ``--samples``)."""

    problem: Problem
    sample: int = 0


def problem_seed(settings: RunSettings, work: Work) -> int:
    """The seed of one sample of a problem, the same for every method (so their rows pair)."""
    seed = settings.seed * 1_000_003 + work.problem.id
    return seed if work.sample == 0 else mix(seed, work.sample)


def _run(settings: RunSettings, methods: list[Method], todo: list[tuple[Work, Method]], bench, writer: RowWriter,
         rank: int, world: int) -> None:
    target, tokenizer = load_model(settings.target, dtype=settings.dtype)
    needs = set().union(*(m.needs for m in methods))
    resources = DraftResources(
        draft_model=load_model(settings.draft, dtype=settings.dtype)[0] if "draft_model" in needs else None,
        draft_model_int8=load_model(settings.draft, quantize="int8")[0] if "draft_model_int8" in needs else None,
        tokenizer=tokenizer, eos_token_id=target.generation_config.eos_token_id)
    stores = {path: load_datastore(path, settings.target, target)
              for path in {m.datastore(settings.datastore) for m in methods} - {None}}
    context = settings.context(tokenizer)
    rules = {m.name: m.build_rule(context) for m in methods}
    live: dict[str, list] = {}
    bar = tqdm(total=len(todo), desc=f"compare[{rank}]" if world > 1 else "compare", unit="run")
    for work, method in batches(todo, settings.batch_size or 1):
        own = replace(resources, datastore=stores.get(method.datastore(settings.datastore)))
        for row in run_batch(work, method, rules[method.name], settings, target, tokenizer, own, bench):
            writer.write(row)
            acc, taus = live.setdefault(method.name, [[], []])
            acc.append(row["grades"][bench.main_grader])
            taus.append(row["tau"])
        bar.update(len(work))
        bar.set_postfix_str(" ".join(f"{n}: acc={sum(a) / len(a):.2f} tau={sum(t) / len(t):.2f}"
                                     for n, (a, t) in live.items()))
    bar.close()


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
    prompts = [tokenizer(t).input_ids for t in texts]
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    seeds = [problem_seed(settings, w) for w in work]  # the same draws for every method on a problem
    streams = [CoupledNoise(seed) if settings.coupled else torch.Generator().manual_seed(seed) for seed in seeds]
    kwargs = dict(max_new_tokens=settings.max_new_tokens, do_sample=settings.do_sample, return_dict_in_generate=True,
                  generator=streams[0] if len(problems) == 1 else streams, rule=rule, num_assistant_tokens=method.k,
                  tokenizer=tokenizer, attention_mask=mask if len(problems) > 1 else None, pad_token_id=pad)
    if settings.do_sample:
        kwargs.update(temperature=settings.temperature, top_k=settings.top_k or 0, top_p=settings.top_p or 1.0)
    started = time.perf_counter()
    if method.decoder == "draft":
        result = generate(resources.draft_model, ids, drafter=NoDrafter(), **kwargs)
    else:
        drafter = make_drafter(method.drafter, resources, method.k, **method.drafter_settings)
        result = generate(target, ids, drafter=drafter, **kwargs)
    wall = time.perf_counter() - started
    row_stats = result.spec_stats.rows or [result.spec_stats]
    batch = ({"first": problems[0].id, "size": len(problems), "wall": wall, "tokens": result.spec_stats.new_tokens}
             if len(problems) > 1 else None)
    return [{**problem_row(w.problem, method, seed, result.sequences[i, width : width + stats.new_tokens], stats,
                           tokenizer, batch, bench, settings.max_new_tokens), "sample": w.sample}
            for i, (w, seed, stats) in enumerate(zip(work, seeds, row_stats))]


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
        "tok_s": stats.tokens_per_second, "machine": machine(),
    }
    if problem.meta:
        row["meta"] = problem.meta
    if batch is not None:
        row["batch"] = batch
    return row
