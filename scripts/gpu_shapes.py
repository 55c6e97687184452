"""Speed of the default pair's shapes on a device where its weights cannot be had (a lent GPU that reaches no
hub): random weights of the same configurations, so only costs mean anything, never acceptance or text.

Writes JSON to OUT: the steady-state forward-cost curve of target and draft per dtype (`semverify.cost`), the
draft length a `DraftPlanner` picks from them at given acceptance rates with the speedup it expects, and the
target alone's total decode tokens/s at several batch sizes (what accuracy runs would choose from).
Usage: python scripts/gpu_shapes.py TARGET_CONFIG_DIR DRAFT_CONFIG_DIR OUT.json [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from semverify import NoDrafter, generate
from semverify.cost import PLAN_SIZES, forward_seconds
from semverify.engine.clock import device_clock
from semverify.machine import machine
from semverify.planner import DraftPlanner

ACCEPTANCE = (0.6, 0.79, 0.9)  # 0.79: sd's per-token acceptance on GSM8K with this pair (results/speed-auto)


def random_model(folder: str, dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(folder)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()


def plan(verify: dict[int, float], draft: float, acceptance: float) -> dict:
    """The planner's pick at a fixed per-position ``acceptance``, with its expected speedup over plain decoding."""
    planner = DraftPlanner(verify, draft, max(verify))
    rates = [acceptance] * planner.k_max
    best = max(range(planner.k_max + 1), key=lambda k: (planner.gain(k, rates), -k))
    return {"k": best, "expected_speedup": planner.gain(best, rates)}


@torch.no_grad()
def decode_rate(model, batch: int, context: int, new: int) -> float:
    """Total new tokens/s of the target alone decoding ``batch`` rows (prefill excluded: two lengths, differenced)."""
    ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=torch.Generator().manual_seed(1))
    ids, clock, seconds = ids.to(model.device), device_clock(model.device), []
    for n in (4, 4 + new):
        start = clock()
        generate(model, ids, drafter=NoDrafter(), max_new_tokens=n, do_sample=False, eos_token_id=None)
        seconds.append(clock() - start)
    return batch * new / (seconds[1] - seconds[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target")
    p.add_argument("draft")
    p.add_argument("out")
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", default="1,8,32,64,128")
    args = p.parse_args()
    sizes = tuple(sorted({*PLAN_SIZES, 24, 32, 64}))
    report: dict = {"machine": machine(torch.device(args.device)), "torch": torch.__version__, "dtypes": {}}
    for dtype in (torch.bfloat16, torch.float32):
        target = random_model(args.target, dtype, args.device)
        context = torch.randint(0, target.config.vocab_size, (1, 256), generator=torch.Generator().manual_seed(0))
        verify = forward_seconds(target, context.to(args.device), sizes, repeats=5, progress=False)
        draft_model = random_model(args.draft, dtype, args.device)
        draft = forward_seconds(draft_model, context.to(args.device), (0,), repeats=5, progress=False)[0]
        del draft_model
        rates = {b: decode_rate(target, b, 128, 32) for b in map(int, args.batches.split(","))}
        report["dtypes"][str(dtype)] = {
            "target_seconds": verify, "draft_seconds": draft,
            "target_relative": {n: s / verify[0] for n, s in verify.items()}, "draft_relative": draft / verify[0],
            "plan": {str(a): plan({n: s for n, s in verify.items() if n in PLAN_SIZES}, draft, a) for a in ACCEPTANCE},
            "decode_tok_s": rates}
        print(json.dumps({str(dtype): report["dtypes"][str(dtype)]}, indent=1), flush=True)
        del target
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - start:.0f} s")
