"""Accuracy mode (``compare --accuracy``): accuracy needs no timed rows, so a run decodes where the machine is
fastest, many rows at once. The batch size is the one with the most total tokens/s for the target alone among
those whose KV caches fit in the memory left, measured once when the run starts and kept by every resume."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from semverify import NoDrafter, generate, load_model
from semverify.engine.clock import device_clock

from .provenance import recorded
from .runner import CheckedRun, compare, left_pad, model_dtypes, one_at_a_time, shard_info

CANDIDATES = (1, 4, 8, 16, 32, 64)
HEADROOM = 0.75  # of the memory left, what the KV caches may take
GAIN = 1.10  # a doubling of the batch is tried further only while it gains this much


def available_memory(device: str | torch.device) -> int:
    """Bytes free for new tensors: the accelerator's free memory, or MemAvailable of /proc/meminfo."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024


def kv_bytes_per_token(model: PreTrainedModel) -> int:
    """Bytes one token of one row adds to ``model``'s KV cache (keys and values of every layer)."""
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * model.dtype.itemsize


def fitting(candidates: tuple[int, ...], row_bytes: int, free: int) -> list[int]:
    """The candidate batch sizes whose caches (``row_bytes`` a row) fit in ``HEADROOM`` of ``free`` bytes (1 always)."""
    return [b for b in candidates if b == 1 or b * row_bytes <= HEADROOM * free]


def decode_rate(model: PreTrainedModel, prompts: list[list[int]], pad: int, new: int = 16) -> float:
    """Total tokens/s of the target alone decoding ``prompts`` together: the time of ``4 + new`` tokens less that
    of 4, so the prefill and the first steps' warm-up cancel out."""
    ids, mask = (t.to(model.device) for t in left_pad(prompts, pad))
    clock, seconds = device_clock(model.device), []
    for n in (4, 4 + new):
        start = clock()
        generate(model, ids, attention_mask=mask if len(prompts) > 1 else None, drafter=NoDrafter(), max_new_tokens=n,
                 do_sample=False, pad_token_id=pad, eos_token_id=None)
        seconds.append(clock() - start)
    return len(prompts) * new / max(seconds[1] - seconds[0], 1e-9)


def measure_batch_size(run: CheckedRun, dtype: str, progress: bool = True) -> dict:
    """Measure the target alone on the run's own prompts at each candidate size that fits, doubling while a
    doubling gains ``GAIN``; returns the choice with its measurements and why."""
    target, _ = load_model(run.settings.target, dtype=dtype, device=run.device)
    tokenizer, settings, bench = run.tokenizer, run.settings, run.benchmark
    prompts = [tokenizer(bench.prompt(tokenizer, p, settings.template)).input_ids for p in run.problems]
    longest = max(map(len, prompts)) + settings.max_new_tokens
    # a draft model's cache grows beside the target's: counted as the target's again, an upper bound
    row_bytes = 2 * kv_bytes_per_token(target) * longest
    free = available_memory(run.device)
    outputs = len(run.problems) * (settings.samples or 1)  # no batch is larger than the run's outputs
    sizes = fitting(tuple(sorted({min(b, outputs) for b in CANDIDATES})), row_bytes, free)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    measured: dict[int, float] = {}
    for size in sizes:
        started = time.perf_counter()
        measured[size] = decode_rate(target, [prompts[i % len(prompts)] for i in range(size)], pad)
        if progress:
            print(f"semverify compare --accuracy: batch {size}: {measured[size]:.1f} tokens/s "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        if len(measured) > 1 and measured[size] < GAIN * measured[sizes[sizes.index(size) - 1]]:
            break
    best = max(measured, key=measured.get)
    left_out = [b for b in CANDIDATES if b <= outputs and b not in sizes]
    rates = ", ".join(f"{b}: {r:.1f}" for b, r in measured.items())
    why = (f"the most total tokens/s of the target alone in {dtype} (batch size: tokens/s {rates})"
           + (f"; {', '.join(map(str, left_out))} would not fit in memory ({free / 2**30:.1f} GiB free, "
              f"{row_bytes / 2**20:.0f} MiB a row)" if left_out else ""))
    del target
    return {"batch_size": best, "dtype": dtype, "measured_tok_s": {str(b): r for b, r in measured.items()},
            "why": why, "memory_free_bytes": free, "row_bytes": row_bytes}


def choose_batch_size(run: CheckedRun, out: Path, dtype: str) -> dict:
    """The accuracy record of the run in ``out``: the one it started with, else (a plain compare run resumed in
    accuracy mode) its batch size, else the one given with ``--batch-size``, else one measured now. Shards
    other than the first wait for the first's choice."""
    given, started = run.settings.batch_size, recorded(out, "settings")
    if shard_info()[0] != 0:
        for _ in range(600):
            if recorded(out, "accuracy") is not None:
                break
            time.sleep(1)
    chosen = recorded(out, "accuracy") or (started and {"batch_size": started["batch_size"] or 1, "dtype": dtype,
                                                        "why": "the batch size the run started with"})
    if chosen:
        if given is not None and given != chosen["batch_size"]:
            raise ValueError(f"this run decodes batches of {chosen['batch_size']} ({chosen['why']}); resume it "
                             f"with --batch-size {chosen['batch_size']} or none, or choose a new --out")
        return chosen
    if given is not None:
        return {"batch_size": given, "dtype": dtype, "why": "given with --batch-size"}
    if shard_info()[0] != 0:
        raise ValueError(f"{out}/run.json has no batch size yet: the first shard of this run has not chosen one")
    return measure_batch_size(run, dtype)


def compare_for_accuracy(run: CheckedRun, out: str | Path, repin: bool = False, timed: int = 0,
                         timed_dtype: str = "bfloat16") -> Path:
    """Run ``run`` in accuracy mode into ``out``: batched at the recorded, given or measured batch size, rows
    untimed; then, with ``timed``, its first ``timed`` problems at batch 1 in ``timed_dtype`` into ``OUT/timed``."""
    out = Path(out)
    unbatched = one_at_a_time([(m, run.rules[m.name]) for m in run.methods])
    if unbatched:
        raise ValueError(f"accuracy mode decodes every method in batches, but {', '.join(unbatched)} decode one "
                         "problem at a time; run them without --accuracy")
    choice = choose_batch_size(run, out, model_dtypes(run, out)["target"])
    print(f"semverify compare --accuracy: batch size {choice['batch_size']}: {choice['why']}", file=sys.stderr)
    size = choice["batch_size"] if choice["batch_size"] > 1 else None
    compare(replace(run, settings=replace(run.settings, batch_size=size)), out, repin, {"accuracy": choice},
            timed=False)
    if timed:
        compare(timed_run(run, timed, timed_dtype), timed_folder(out), repin)
    return out


def timed_run(run: CheckedRun, problems: int, dtype: str) -> CheckedRun:
    """The timed pass of an accuracy run: its first ``problems`` problems one at a time, one sample each, in
    ``dtype``, with the same methods, rules and sampling settings (rows of its own, in ``OUT/timed``)."""
    settings = replace(run.settings, limit=min(problems, len(run.problems)), batch_size=None, samples=None, dtype=dtype)
    return replace(run, settings=settings, problems=run.problems[: settings.limit])


def timed_folder(out: str | Path) -> Path:
    """Where an accuracy run keeps its timed pass."""
    return Path(out) / "timed"
