"""What the loop's host bookkeeping costs per step, against transformers' plain batched decoding step.

For each (batch B, prompt length P) it decodes a batch of B random prompts of P tokens (greedy, no EOS) and times:

- **plain**: transformers' own ``model.generate``, one token per row per step;
- **oracle**: semverify with `OracleDrafter`, a drafter that proposes the target's own greedy continuation
  (precomputed by ``model.generate`` on the same prompts), so every draft is accepted: a step is one (k+1)-token
  verification forward plus the loop's bookkeeping and no drafting at all;
- **ragged**: the oracle with rows that keep different numbers of draft tokens (row r, n tokens into its output,
  keeps the first (r + n // (k + 1)) mod (k + 1) of its k and proposes wrong ones after them), so the rejected columns
  leave holes in the batched cache: what the KV memory column measures;
- **draft**: semverify with a real draft model (``assistant_model=``, drafting exactly k tokens a step), and
  **assisted**: transformers' assisted generation with the same draft and k, at batch 1 (its only batch size).

A step's time removes the prefill: a forward pre-hook on the target reads a clock at the start of every target
forward, and a step is the span from the second forward's start to the last one's, over the forwards between
(times forwards per step, from the loop's statistics, where a step is not exactly one target forward; on an
accelerator the clock drains the queue first). Every method runs once per repeat, in an order that alternates
per repeat after a warm-up; the tables give medians and the JSON every sample. No EOS ends a row: the target's
``eos_token_id`` is set to None in every call, which is equivalent to ``min_new_tokens`` without
transformers' ``MinNewTokensLengthLogitsProcessor`` (vocabulary-sized work every step that would be charged to
the plain step, and which semverify would apply at every verified position).

Derived: the ratio of the oracle step to the plain step, and the perfect-drafter speedup, tokens per second of
the oracle against the plain step's: (tokens per oracle step / oracle step) / (1 / plain step).

**Host syncs per step** (`SyncCounter`): a second, untimed run of each method under a
``torch.overrides.TorchFunctionMode`` that counts the calls that read a tensor's values into Python
(``item``, ``tolist``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``, ``nonzero``, ``cpu``, ``numpy``,
``is_nonzero``, ``equal``, ``allclose``, and ``to`` from an accelerator onto the CPU), the ops whose output shape
depends on values (a boolean-mask ``__getitem__``/``__setitem__``/``index_put_``, ``masked_select``,
``unique``, ``repeat_interleave`` without ``output_size``; counted apart as ``shape syncs``), and calls of
``torch.cuda.synchronize`` (patched for the run). Counts are per step over the same span as the times, split
into those inside a model's forward (the target's or the draft's; transformers' own) and the host code around
them (the loop, the drafter, the rule), by function and by the device of the tensor read.

What it cannot see: reads made inside C++ (an op that syncs internally, e.g. ``torch.tensor`` built from a CUDA
tensor, or a kernel's own ``cudaMemcpy``), reads inside a torch function that is itself overridable (a
Python-level torch function such as ``Tensor.__format__`` counts once, as itself), code run under
``torch._C.DisableTorchFunction`` or compiled with ``torch.compile``, ``Stream.synchronize`` and
``Event.synchronize``, and, on a CPU run, which reads would be device syncs: every read is counted, also of
tensors that would stay on the host (per-device counts tell them apart on an accelerator).

**KV memory**: the target cache's width (columns, holes included) at the loop's last ``on_step`` event against
the live tokens then (the longest row's prompt and output), and the largest ratio over the steps.

    semverify loop-cost --model tiny --out results/loop-cost/tiny
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from tqdm import tqdm
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

import semverify
import semverify.generation as _generation
from semverify.engine.clock import device_clock
from semverify.engine.sampling import Sampler
from semverify.machine import keep_large_buffers, machine
from semverify.types import Draft

from .env import environment

QWEN_VOCAB = 151_936  # the real Qwen2.5 vocabulary, so that the vocabulary-sized work per token is real
BATCHES = (1, 8, 32)
PROMPTS = (64, 2048)
METHODS = ("plain", "oracle", "ragged", "draft", "assisted")

# reads of a tensor's values into Python: a device->host sync on an accelerator
READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy",
                   "is_nonzero", "equal", "allclose"})
# ops whose output shape depends on the values (a sync on an accelerator)
SHAPE_SYNCS = frozenset({"masked_select", "unique", "unique_consecutive", "_unique2", "repeat_interleave"})
_INDEXING = frozenset({"__getitem__", "__setitem__", "index_put_", "index_put"})


def tiny_qwen(seed: int = 0, vocab: int = QWEN_VOCAB, layers: int = 2) -> PreTrainedModel:
    """A tiny random Qwen2 (hidden 64, 4 heads, 2 KV heads, intermediate 128) in fp32, eval mode, with no EOS,
    deterministic for ``seed``; with the real Qwen vocabulary its vocabulary-sized work is the real model's."""
    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                         eos_token_id=None, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


@dataclass
class Models:
    target: PreTrainedModel
    draft: PreTrainedModel | None
    label: str  # as the table names it
    description: str  # what they are


def load_models(name: str, draft: str | None = None, dtype: str = "float32", device: str = "cpu",
                vocab: int = QWEN_VOCAB, random_weights: bool = False) -> Models:
    """``tiny`` (two tiny random Qwen2s, target and draft, built from config), ``pair`` (the default pair
    through `semverify.load_model`) or a hub id / folder (``draft``: its draft model, or none);
    ``random_weights``: a hub id or folder's ``config.json`` with random weights (costs only)."""
    from semverify.models import DEFAULT_DRAFT, DEFAULT_TARGET, load_model

    if name == "tiny":
        target, small = tiny_qwen(0, vocab), tiny_qwen(1, vocab)
        return Models(target.to(device), small.to(device), "tiny",
                      f"tiny random Qwen2 (2 layers, hidden 64, vocabulary {vocab:,}) <- another (seed 1), float32")
    if name == "pair":
        name, draft = DEFAULT_TARGET, draft or DEFAULT_DRAFT

    def load(path: str, role: str) -> PreTrainedModel:
        if random_weights:
            return _from_config(path, dtype, device)
        return load_model(path, dtype=dtype, device=device, role=role)[0]

    target = load(name, "target")
    small = load(draft, "draft") if draft else None
    what = f"{name} <- {draft}" if draft else name
    return Models(target, small, name if name != DEFAULT_TARGET else "pair",
                  f"{what}, {dtype}" + (" (random weights)" if random_weights else ""))


def _from_config(name: str, dtype: str, device: str) -> PreTrainedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(name)
    return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).to(device).eval()


class OracleDrafter:
    """Proposes each row's precomputed continuation (``continuation`` [B, N], the target's own greedy tokens
    after the prompts): every draft is accepted under greedy verification, and drafting costs no forward.

    It implements the batch protocol (`semverify.engine.drafting.RowDrafter`: all rows proposed at once, by
    indexing the continuation at each row's output length, the row's sequence length less its prompt's) and
    the one-sequence protocol on top of it, which the loop drives at batch 1."""

    gives_probs = False
    needs_target_hidden = False
    batching = "rows"

    def __init__(self, continuation: torch.LongTensor, ragged: bool = False, vocab: int | None = None) -> None:
        if ragged and vocab is None:
            raise ValueError("a ragged oracle needs the vocabulary size for the wrong tokens it proposes")
        self.continuation, self.ragged, self.vocab = continuation, ragged, vocab
        self.rows: list[int] = []
        self.prompt_lengths: list[int] = []
        self._left = continuation

    # the batch protocol
    def reset_rows(self, prompts: list[torch.LongTensor]) -> None:
        if len(prompts) != self.continuation.shape[0]:
            raise ValueError(f"the oracle holds {self.continuation.shape[0]} rows' continuations; got "
                             f"{len(prompts)} prompts")
        self.prompt_lengths = [len(p) for p in prompts]
        self.keep_rows(list(range(len(prompts))), reset=True)

    def propose_rows(self, sequences: list[torch.LongTensor], ks: list[int], sampler: Sampler,
                     generators: list) -> Draft:
        device, n = self._left.device, self._left.shape[1]
        starts = [len(s) - self.prompt_lengths[r] for s, r in zip(sequences, self.rows)]
        lengths = [max(0, min(k, n - start)) for k, start in zip(ks, starts)]
        width = max(lengths, default=0)
        if width == 0:
            return Draft.empty(len(sequences), device)
        index = (torch.tensor(starts, device=device)[:, None] + torch.arange(width, device=device)).clamp_max(n - 1)
        tokens = self._left.gather(1, index)
        if self.ragged:  # row r keeps its first (r + n // (k + 1)) mod (k + 1) tokens; the ones after them are wrong
            right = [(row + start // (k + 1)) % (k + 1) for row, k, start in zip(self.rows, ks, starts)]
            wrong = torch.arange(width, device=device)[None, :] >= torch.tensor(right, device=device)[:, None]
            tokens = torch.where(wrong, (tokens + 1) % self.vocab, tokens)
        return Draft(tokens, lengths=torch.tensor(lengths, device=device))

    def as_ragged(self, vocab: int) -> "OracleDrafter":
        """This oracle with rows that keep different numbers of their draft tokens (see the module)."""
        return OracleDrafter(self.continuation, ragged=True, vocab=vocab)

    def commit_rows(self, accepted, next_tokens, target_hidden) -> None:
        pass

    def feedback_rows(self, outcomes) -> None:
        pass

    def keep_rows(self, rows: list[int], reset: bool = False) -> None:
        self.rows = list(rows) if reset else [self.rows[i] for i in rows]
        self._left = self.continuation[torch.tensor(self.rows, dtype=torch.long, device=self.continuation.device)]

    # the one-sequence protocol (the loop drives a batch of one through it)
    def reset(self, input_ids: torch.LongTensor) -> None:
        self.reset_rows(list(input_ids))

    def propose(self, input_ids: torch.LongTensor, k: int, sampler: Sampler, generator) -> Draft:
        return self.propose_rows(list(input_ids), [k], sampler, [generator])

    def commit(self, n_accepted, next_token, target_hidden=None) -> None:
        pass

    def feedback(self, outcome) -> None:
        pass


class SyncCounter(TorchFunctionMode):
    """Counts the host reads of tensor values (see the module) while it is entered, keyed by (where, kind,
    function, device): ``where`` is ``"forward"`` inside a watched model's forward (`watch`), else ``"host"``;
    ``kind`` is ``"read"``, ``"shape"`` (a value-dependent output shape) or ``"synchronize"``."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.depth = 0
        self._handles: list = []
        self._synchronize = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = sync_kind(func, args, kwargs)
        if kind is not None:
            tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
            device = tensor.device.type if tensor is not None else "-"
            self.counts[("forward" if self.depth else "host", kind, _name(func), device)] += 1
        return func(*args, **kwargs)

    def watch(self, model: PreTrainedModel | None) -> None:
        """Count what happens inside ``model``'s forward as ``"forward"``."""
        if model is None:
            return

        def enter(module, args):
            self.depth += 1

        def leave(module, args, output):
            self.depth -= 1

        self._handles += [model.register_forward_pre_hook(enter),
                          model.register_forward_hook(leave, always_call=True)]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self):
        if hasattr(torch, "cuda"):
            self._synchronize = torch.cuda.synchronize

            def synchronize(*args, **kwargs):
                self.counts[("forward" if self.depth else "host", "synchronize", "cuda.synchronize", "cuda")] += 1
                return self._synchronize(*args, **kwargs)

            torch.cuda.synchronize = synchronize
        return super().__enter__()

    def __exit__(self, *exc):
        if self._synchronize is not None:
            torch.cuda.synchronize = self._synchronize
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return super().__exit__(*exc)


def sync_kind(func, args, kwargs) -> str | None:
    """``"read"``, ``"shape"`` or None (not a sync) for a call the mode sees."""
    name = _name(func)
    if name in READS:
        return "read"
    if name == "to":
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
        return ("read" if source is not None and source.device.type != "cpu" and target is not None
                and torch.device(target).type == "cpu" else None)
    if name in SHAPE_SYNCS:
        return None if name == "repeat_interleave" and kwargs.get("output_size") is not None else "shape"
    if name in _INDEXING and len(args) > 1 and _has_bool_index(args[1]):
        return "shape"
    return None


def _has_bool_index(index) -> bool:
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


def random_batch(vocab: int, batch: int, prompt: int, device: str | torch.device = "cpu",
                 seed: int = 0) -> tuple[torch.LongTensor, torch.LongTensor]:
    """``batch`` random prompts of ``prompt`` tokens, seeded, and their (all-ones) attention mask."""
    ids = torch.randint(0, vocab, (batch, prompt), generator=torch.Generator().manual_seed(seed + 1000 * batch))
    return ids.to(device), torch.ones_like(ids).to(device)


@dataclass
class Call:
    """One decode: what it returned, the target forwards' start readings, its wall time."""

    marks: list = field(default_factory=list)  # per target forward: a clock reading, or the counter's counts
    wall_s: float = 0.0
    steps: int = 0  # loop iterations
    tokens_per_step: float = 1.0  # new tokens per row per step
    new: torch.LongTensor | None = None  # [B, N] new tokens
    kv: list = field(default_factory=list)  # per step: (cache width, live tokens)
    forward_s: list = field(default_factory=list)  # per target forward: its own duration (timed calls)

    def per_step(self, values: list) -> float | None:
        """The change of ``values`` (one per target forward) per step, from the second forward to the last."""
        if len(values) < 3 or not self.steps:
            return None
        return (values[-1] - values[1]) / (len(values) - 2) * len(values) / self.steps


class LoopCost:
    """The models, settings and decoders of one measurement: ``new_tokens`` per row (rounded up to a multiple of
    k + 1), ``draft_tokens`` in the draft model's runs (default 2 (k + 1))."""

    def __init__(self, models: Models, k: int = 4, new_tokens: int = 80, draft_tokens: int | None = None) -> None:
        self.models, self.k = models, k
        self.new_tokens = -(-new_tokens // (k + 1)) * (k + 1)  # a multiple of k + 1: every oracle step is whole
        # a draft model's runs (a step drafts k tokens whatever it keeps; random weights keep about none)
        self.draft_tokens = min(self.new_tokens, draft_tokens or 2 * (k + 1))
        self.target, self.draft = models.target, models.draft
        self.device = self.target.device
        self.clock = device_clock(self.device)
        self.vocab = self.target.config.get_text_config().vocab_size
        if self.draft is not None:  # transformers' assisted generation drafts exactly k tokens a step, as ours
            config = self.draft.generation_config
            config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
            config.assistant_confidence_threshold = 0.0

    def tokens(self, method: str, purpose: str = "timed") -> int:
        """New tokens per row of ``method``'s runs: timed and counted, or a warm-up's (a few steps)."""
        if purpose == "warm-up":
            return min(self.new_tokens, 8 if method == "plain" else 2 * (self.k + 1) if method in ("oracle", "ragged")
                       else 3)
        return self.new_tokens if method in ("plain", "oracle", "ragged") else self.draft_tokens

    def methods(self, batch: int) -> list[str]:
        return [m for m in METHODS if (m not in ("draft", "assisted") or self.draft is not None)
                and (m != "assisted" or batch == 1)]

    def continuation(self, ids: torch.LongTensor, mask: torch.LongTensor, new_tokens: int) -> torch.LongTensor:
        """The target's greedy continuation of the prompts, by transformers (what the oracle proposes)."""
        with torch.inference_mode():
            out = self.target.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, **_GREEDY)
        return out[:, ids.shape[1]:]

    def decode(self, method: str, ids: torch.LongTensor, mask: torch.LongTensor, new_tokens: int,
               oracle: OracleDrafter | None, mark: Callable[[], object], on_step=None) -> Call:
        """One decode with ``method``; ``mark()`` is read at the start of every target forward."""
        call = Call()
        handle = self.target.register_forward_pre_hook(lambda module, args: call.marks.append(mark()))
        timing = mark is self.clock
        after = self.target.register_forward_hook(
            lambda module, args, output: call.forward_s.append(mark() - call.marks[-1]) if timing else None)
        common = dict(attention_mask=mask, max_new_tokens=new_tokens, **_GREEDY)
        try:
            start = self.clock()
            if method in ("plain", "assisted"):
                extra = {"assistant_model": self.draft} if method == "assisted" else {}
                with torch.inference_mode():
                    out = self.target.generate(ids, **common, **extra)
                call.wall_s = self.clock() - start
                call.new = out[:, ids.shape[1]:]
                call.steps = len(call.marks)  # one target forward a step
                call.tokens_per_step = call.new.shape[1] / call.steps
            else:
                extra = ({"drafter": oracle} if method == "oracle" else {"drafter": oracle.as_ragged(self.vocab)}
                         if method == "ragged"
                         else {"assistant_model": self.draft, "assistant_confidence_threshold": 0.0})
                with _watching_steps(on_step):
                    out = semverify.generate(self.target, ids, **common, **extra, num_assistant_tokens=self.k,
                                             return_dict_in_generate=True)
                call.wall_s = self.clock() - start
                call.new = out.sequences[:, ids.shape[1]:]
                stats = out.spec_stats
                call.steps = max((r.steps for r in stats.rows), default=0) if stats.rows else stats.steps
                call.tokens_per_step = stats.tau
        finally:
            handle.remove()
            after.remove()
        return call


_GREEDY = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


@contextmanager
def _watching_steps(on_step):
    """``semverify.generate`` with ``on_step`` handed to the loop (generate itself takes none)."""
    if on_step is None or not hasattr(_generation, "speculative_generate"):
        yield
        return
    loop = _generation.speculative_generate

    def with_steps(*args, **kwargs):
        return loop(*args, **kwargs, on_step=on_step)

    with mock.patch.object(_generation, "speculative_generate", with_steps):
        yield


def kv_width(cache) -> int | None:
    """The columns a target cache holds (holes included): a transformers cache, or an object holding one."""
    for obj in (cache, getattr(cache, "cache", None)):
        layers = getattr(obj, "layers", None)
        keys = getattr(layers[0], "keys", None) if layers else None
        if isinstance(keys, torch.Tensor) and keys.dim() == 4:
            return keys.shape[-2]
    try:
        return int(cache.get_seq_length())
    except (AttributeError, TypeError):
        return None


def measure_cell(lc: LoopCost, batch: int, prompt: int, repeats: int) -> dict:
    """Every method on one (B, P): ``repeats`` timed runs after a warm-up, then one counted run each."""
    ids, mask = random_batch(lc.vocab, batch, prompt, lc.device)
    n = lc.new_tokens
    oracle = OracleDrafter(lc.continuation(ids, mask, n))
    methods = lc.methods(batch)
    for m in methods:  # first calls at these shapes pay one-off allocation costs
        lc.decode(m, ids, mask, lc.tokens(m, "warm-up"), oracle, time.perf_counter)
    samples: dict[str, list] = {m: [] for m in methods}
    for r in range(repeats):
        for m in methods if r % 2 == 0 else methods[::-1]:
            call = lc.decode(m, ids, mask, lc.tokens(m), oracle, lc.clock)
            samples[m].append(call)
    cell = {"batch": batch, "prompt": prompt, "new_tokens": n, "draft_tokens": lc.draft_tokens, "k": lc.k}
    for m in methods:
        calls = samples[m]
        per_step = [c.per_step(c.marks) for c in calls]
        per_step_ms = [1000 * s if s is not None else 1000 * c.wall_s / c.steps for s, c in zip(per_step, calls)]
        result = {"ms_per_step": statistics.median(per_step_ms), "samples_ms_per_step": per_step_ms,
                  "wall_s": [c.wall_s for c in calls], "steps": calls[0].steps, "target_forwards": len(calls[0].marks),
                  "tokens_per_step": calls[0].tokens_per_step,
                  "prefill_removed": all(s is not None for s in per_step)}
        result["ms_per_token"] = result["ms_per_step"] / result["tokens_per_step"]
        forwards = [1000 * statistics.mean(c.forward_s[1:]) for c in calls if len(c.forward_s) > 1]
        if forwards:  # the target forward alone (prefill left out): the floor under a step
            result["forward_ms"] = statistics.median(forwards)
        result.update(count_syncs(lc, m, ids, mask, lc.tokens(m), oracle))
        if m in ("oracle", "ragged"):
            result["identical_to_generate"] = bool(torch.equal(calls[0].new.cpu(), oracle.continuation.cpu()))
        cell[m] = result
    plain, best = cell["plain"]["ms_per_step"], cell["oracle"]
    cell["ratio"] = best["ms_per_step"] / plain
    if "forward_ms" in best and "forward_ms" in cell["plain"]:  # what the loop adds beyond the forwards
        cell["host_ms_per_step"] = {m: cell[m]["ms_per_step"] - cell[m]["forward_ms"] for m in ("plain", "oracle")}
        cell["forward_ratio"] = best["forward_ms"] / cell["plain"]["forward_ms"]
    cell["perfect_drafter_speedup"] = (best["tokens_per_step"] / best["ms_per_step"]) / (1 / plain)
    return cell


def count_syncs(lc: LoopCost, method: str, ids, mask, new_tokens: int, oracle: OracleDrafter) -> dict:
    """One untimed run of ``method`` under a `SyncCounter`: syncs per step (host code and forwards, by kind,
    function and device), and for semverify the target cache's width against the live tokens."""
    counter = SyncCounter()
    counter.watch(lc.target)
    if method != "plain":
        counter.watch(lc.draft)
    kv: list[tuple[int | None, int]] = []

    def on_step(event) -> None:
        kv.append((kv_width(event.target_cache), event.sequences.shape[1]))

    with counter:
        call = lc.decode(method, ids, mask, new_tokens, oracle, lambda: Counter(counter.counts),
                         on_step=on_step if method in ("oracle", "ragged", "draft") else None)
    first, last = (call.marks[1], call.marks[-1]) if len(call.marks) >= 3 else (Counter(), counter.counts)
    scale = 1 / call.steps if len(call.marks) < 3 else len(call.marks) / (len(call.marks) - 2) / call.steps
    delta = {key: (last[key] - first[key]) * scale for key in set(last) | set(first) if last[key] != first[key]}

    def total(**where) -> float:
        return sum(v for key, v in delta.items()
                   if all(dict(zip(("where", "kind", "function", "device"), key))[f] == w for f, w in where.items()))

    by_function: Counter = Counter()
    for (where, _kind, function, device), v in delta.items():
        by_function[f"{where}:{function}@{device}"] += v
    out = {"syncs_per_step": sum(delta.values()), "syncs_per_step_host": total(where="host"),
           "syncs_per_step_forward": total(where="forward"), "shape_syncs_per_step": total(kind="shape"),
           "synchronize_per_step": total(kind="synchronize"),
           "syncs_per_step_on_device": sum(v for key, v in delta.items() if key[3] not in ("cpu", "-"))
           + total(kind="synchronize"),
           "syncs_by_function": dict(sorted(by_function.items(), key=lambda kv: -kv[1]))}
    widths = [(w, live) for w, live in kv if w is not None]
    if widths:
        width, live = widths[-1]
        out.update(kv_width_end=width, live_tokens_end=live, kv_width_over_live=width / live,
                   kv_width_over_live_max=max(w / lv for w, lv in widths))
    return out


def sync_growth(cells: list[dict]) -> dict[int, float]:
    """Per prompt length: how many more syncs a step makes per extra row, from the two smallest batches
    (B=8 against B=1: their difference over 7)."""
    growth = {}
    for p in sorted({c["prompt"] for c in cells}):
        row = sorted((c for c in cells if c["prompt"] == p), key=lambda c: c["batch"])
        if len(row) >= 2:
            lo, hi = row[0], next((c for c in row if c["batch"] == 8), row[1])
            growth[p] = ((hi["oracle"]["syncs_per_step"] - lo["oracle"]["syncs_per_step"])
                         / (hi["batch"] - lo["batch"]))
    return growth


COLUMNS = ("model", "B", "P", "plain ms/step", "semverify ms/step (oracle)", "ratio", "perfect-drafter speedup",
           "syncs/step", "plain syncs/step", "ragged oracle ms/step", "draft-model ms/step",
           "transformers assisted ms/step",
           "KV width / live", "verify forward / plain forward (ms)", "outside forwards: plain / semverify (ms)")


def markdown(cells: list[dict], env: dict) -> str:
    lines = [f"Loop cost, {env['models']}, k = {env['k']}, {env['new_tokens']} new tokens ({env['draft_tokens']} with "
             f"the draft model), greedy, median of "
             f"{env['repeats']}, {env['date'][:10]}, machine: {env['machine']} ({env['torch_threads']} threads), "
             f"torch {env['torch']}, transformers {env['transformers']}, malloc: {env.get('malloc', 'default')}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for c in cells:
        o, g, d, a = c["oracle"], c.get("ragged"), c.get("draft"), c.get("assisted")
        syncs = f"{o['syncs_per_step']:.0f} ({o['syncs_per_step_host']:.0f} host)"
        if env.get("device", "cpu") != "cpu":
            syncs += f", {o['syncs_per_step_on_device']:.0f} on device"
        kv = "/".join(f"{x['kv_width_over_live']:.2f}" for x in (o, g, d) if x and "kv_width_over_live" in x)
        lines.append(
            f"| {c['model']} | {c['batch']} | {c['prompt']} | {c['plain']['ms_per_step']:.2f} | "
            f"{o['ms_per_step']:.2f} ({o['ms_per_token']:.2f}/token) | {c['ratio']:.2f} | "
            f"{c['perfect_drafter_speedup']:.2f}x | {syncs} | {c['plain']['syncs_per_step']:.0f} | "
            + (f"{g['ms_per_step']:.2f} (tau {g['tokens_per_step']:.2f})" if g else "") + " | "
            + (f"{d['ms_per_step']:.2f} (tau {d['tokens_per_step']:.2f})" if d else "") + " | "
            + (f"{a['ms_per_step']:.2f} (tau {a['tokens_per_step']:.2f})" if a else "") + f" | {kv} | "
            + (f"{o['forward_ms']:.2f} / {c['plain']['forward_ms']:.2f} ({c['forward_ratio']:.2f}x) | "
               f"{c['host_ms_per_step']['plain']:.2f} / {c['host_ms_per_step']['oracle']:.2f} |"
               if "forward_ratio" in c else " | |"))
    growth = sync_growth(cells)
    notes = ["", "A step: one target forward and the bookkeeping around it, prefill removed (the span from the second "
             "target forward to the last); oracle: a drafter that proposes the target's own greedy continuation, "
             f"so every step is a {env['k'] + 1}-token verification with nothing drafted; ratio = oracle step / "
             "plain step; perfect-drafter speedup = (tokens per oracle step / oracle step) / (1 / plain step). "
             "Syncs/step: reads of tensor values into Python (item, tolist, bool, int, nonzero, cpu, ...), "
             "value-dependent shapes and cuda.synchronize, per oracle step (host: outside the models' forwards); "
             "KV width / live: the target cache's columns at the last step over the longest row's prompt and "
             "output (oracle/ragged oracle/draft model; the ragged oracle's rows keep different numbers of draft "
             "tokens, so its rejected columns leave holes). Verify forward / plain forward: the target's forward "
             "alone (pre- to post-hook), the oracle's 5-token verification against the plain 1-token step: the "
             "floor of the ratio that no bookkeeping can lower; outside forwards: each step's time beyond its "
             "target forward (the loop's host work, sampling and, for the plain step, transformers' own)."]
    if growth:
        notes.append("Syncs per step grow by " + ", ".join(f"{g:.2f} per row at P = {p}" for p, g in growth.items())
                     + " (the oracle, between the two smallest batches).")
    return "\n".join(lines + notes) + "\n"


def run_loop_cost(args) -> str:
    """The whole measurement for the parsed ``semverify loop-cost`` arguments; returns the Markdown table."""
    batches, prompts = _sizes(args.batches, "--batches"), _sizes(args.prompts, "--prompts")
    torch.set_num_threads(args.threads)
    kept = args.keep_large_buffers and keep_large_buffers()
    if args.keep_large_buffers and not kept:
        raise ValueError("--keep-large-buffers needs glibc's malloc (Linux); this process has another")
    models = load_models(args.model, args.draft, args.dtype, args.device, args.vocab, args.random_weights)
    lc = LoopCost(models, args.k, args.new_tokens, args.draft_tokens)
    env = environment(model=args.model, draft=args.draft, models=models.description, label=models.label,
                      dtype=args.dtype if args.model != "tiny" else "float32", k=args.k, new_tokens=lc.new_tokens,
                      draft_tokens=lc.draft_tokens, repeats=args.repeats, batches=batches, prompts=prompts,
                      device=args.device, machine=machine(lc.device),
                      malloc="glibc, buffers up to 1 GiB reused" if kept else "default")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells: list[dict] = []
    grid = [(b, p) for p in prompts for b in batches]
    for b, p in tqdm(grid, desc="loop-cost", unit="cell"):
        cells.append({"model": models.label, **measure_cell(lc, b, p, args.repeats)})
        growth = sync_growth(cells)
        (out / "loop-cost.json").write_text(json.dumps({"environment": env, "cells": cells,
                                                        "sync_growth_per_row": growth}, indent=2))
        (out / "loop-cost.md").write_text(markdown(cells, env))
    return markdown(cells, env)


def _sizes(text: str, option: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"{option} takes whole numbers separated by commas, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"{option} takes positive whole numbers, got {text!r}")
    return sizes
