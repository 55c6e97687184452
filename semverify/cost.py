"""What a forward costs on this machine: seconds of one target forward against the number of draft tokens it
verifies, measured in steady state (a warmed, cached context, interleaved repeats, medians) and cached per
model, dtype, machine, thread count and torch version under the semverify cache.

The draft-shape planner reads it (`semverify.planner`); `semverify forward-cost` measures a long curve and
writes it there too. Costs change by machine far more than by anything else: a 6-token bf16 forward costs
4.1 one-token forwards on a 2-core AVX2 EPYC, 1.1 on an AMX Xeon.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PretrainedConfig, PreTrainedModel

from .engine.cache import keep_first, new_cache
from .engine.clock import device_clock
from .engine.tree import tree_attention_mask, tree_position_ids
from .machine import machine
from .model_cache import cache_root, model_key

PLAN_SIZES = (0, 1, 2, 3, 4, 6, 8, 12, 16)  # draft tokens a planner chooses among


@torch.no_grad()
def forward_seconds(model, context: torch.LongTensor, sizes: tuple[int, ...], repeats: int,
                    progress: bool = True) -> dict[int, float]:
    """Median seconds of one forward over [root, n nodes] after a cache of ``context``, per n.

    The nodes form a bushy tree (each node's parent is a random earlier node, -1 for the root) so the
    mask is the loop's; repeats cycle through the sizes so drifts in machine speed hit all alike.
    """
    cache, past = new_cache(model), context.shape[1] - 1
    model(context[:, :-1], cache=cache, use_cache=True)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.get_text_config().vocab_size
    times: dict[int, list[float]] = {n: [] for n in sizes}
    clock = device_clock(context.device)
    for _ in tqdm(range(repeats + 1), desc="forward cost", disable=not progress):
        for n in sizes:
            parents = torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)], dtype=torch.long)
            drawn = torch.randint(0, vocab, (1, n), generator=gen).to(context.device)
            tokens = torch.cat([context[:, -1:], drawn], dim=1)
            mask = tree_attention_mask(parents, past, 1, model.dtype, context.device)
            positions = tree_position_ids(parents, past, 1, context.device)
            start = clock()
            model(tokens, cache=cache, attention_mask=mask, position_ids=positions, use_cache=True,
                  logits_to_keep=n + 1)
            times[n].append(clock() - start)
            keep_first(cache, past)
    return {n: statistics.median(t[1:]) for n, t in times.items()}  # the first round warms up


def cost_at(costs: dict[int, float] | dict[str, float], n: float) -> float:
    """The cost of a forward with ``n`` draft tokens, linearly interpolated between sizes (held at the end
    values outside them)."""
    sizes = sorted(costs, key=int)
    return float(np.interp(n, [int(k) for k in sizes], [costs[k] for k in sizes]))


def curve_identity(name: str, config: PretrainedConfig, dtype: torch.dtype | str, device: torch.device | str) -> dict:
    """What a cost curve depends on: the model (name, and its configuration apart from the dtype), the weights'
    dtype (or ``"int8"``), the machine, the thread count and the torch version."""
    settings = {k: v for k, v in config.to_dict().items() if k not in ("dtype", "torch_dtype")}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"model": name, "config": digest, "dtype": str(dtype), "machine": machine(torch.device(device)),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def cost_identity(model: PreTrainedModel) -> dict:
    """The identity of ``model``'s curve (`curve_identity`); PyTorch's dynamic int8 weights count as dtype int8."""
    int8 = any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in model.modules())
    return curve_identity(str(getattr(model, "name_or_path", "") or ""), model.config,
                          "int8" if int8 else model.dtype, model.device)


def cost_path(identity: dict) -> Path:
    """Where the curve of ``identity`` is cached."""
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]
    name = model_key(identity["model"]) if identity["model"] else "model"
    return cache_root() / "forward-cost" / f"{name}-{key}.json"


def cost_file(model: PreTrainedModel) -> Path:
    """Where this model's cost curve on this machine is cached."""
    return cost_path(cost_identity(model))


def cached_costs(identity: dict, sizes: tuple[int, ...] = (0,)) -> dict[int, float] | None:
    """The cached curve of ``identity`` if it has every size in ``sizes``, else None."""
    path = cost_path(identity)
    if not path.is_file():
        return None
    seconds = {int(n): s for n, s in json.loads(path.read_text())["seconds"].items()}
    return seconds if set(sizes) <= set(seconds) else None


def save_costs(model: PreTrainedModel, seconds: dict[int, float], context: int, repeats: int) -> Path:
    """Cache a measured curve (seconds per number of draft tokens) for ``model`` on this machine."""
    path = cost_file(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"identity": cost_identity(model), "context": context, "repeats": repeats,
              "seconds": {str(n): s for n, s in sorted(seconds.items())}}
    path.write_text(json.dumps(record, indent=2))
    return path


def forward_costs(model: PreTrainedModel, sizes: tuple[int, ...] = PLAN_SIZES, repeats: int = 3,
                  context: int = 256, progress: bool = True) -> dict[int, float]:
    """Seconds of one forward of ``model`` with n draft tokens, per n: the cached curve of this model on this
    machine, else a short one measured now (a few seconds to a minute, with a progress line) and cached."""
    sizes = tuple(sorted({0, *sizes}))
    cached = cached_costs(cost_identity(model), sizes)
    if cached is not None:
        return cached
    old = cached_costs(cost_identity(model)) or {}  # a shorter curve is measured again with the new sizes
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0)).to(model.device)
    seconds = forward_seconds(model, ids, tuple(sorted({*sizes, *old})), repeats, progress)
    save_costs(model, seconds, context, repeats)
    return seconds
