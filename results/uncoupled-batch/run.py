"""Uncoupled sampled batches of one-step rows on a tiny pair (vocabulary 8): wall time and rule calls.

Run from the root of each checkout: ``python results/uncoupled-batch/run.py [rule]``. Before coupling 2 an uncoupled
batch was judged row by row (a rule call per row and step); after it the engine draws for the whole batch from one
law call (each row from its own stream), and coupled lossless rows need no law at all.
"""

import sys
import time

import torch

sys.path.insert(0, ".")  # the checkout this runs from, not the installed one

import semverify  # noqa: E402
from tests.helpers import tiny_model  # noqa: E402

ROWS = 2000
target, draft = tiny_model(11, vocab=8, init_std=0.5), tiny_model(12, vocab=8, init_std=0.5)
rule = semverify.get_rule(sys.argv[1] if len(sys.argv) > 1 else "speculative")
calls = [0]
hook = "law" if getattr(rule, "states_law", False) else "__call__"  # count calls without changing the rule's kind
original = getattr(type(rule), hook)


def counted(self, x):
    calls[0] += 1
    return original(self, x)


setattr(type(rule), hook, counted)
ids = torch.tensor([[1, 2, 3]]).expand(ROWS, -1)
for label, streams in (("generator per row", [torch.Generator().manual_seed(r) for r in range(ROWS)]),
                       ("no generator", None), ("coupled", [semverify.CoupledNoise(r) for r in range(ROWS)])):
    calls[0] = 0
    start = time.perf_counter()
    semverify.generate(target, ids, attention_mask=torch.ones_like(ids), assistant_model=draft, num_assistant_tokens=1,
                       max_new_tokens=2, do_sample=True, top_k=0, rule=rule, generator=streams, pad_token_id=0)
    print(f"{label}: {time.perf_counter() - start:.2f} s, {calls[0]} {hook} calls", flush=True)
