"""Draft-model trees in a batch, before and after they were batched (issue 62): one code checkout per process.

Times `speculative_generate` with `ModelTreeDrafter` (budget 24, branch 2, threshold 0.6: sd_tree's drafter) at
k = 8 on tiny random Qwen2 models (target seed 0, draft seed 1; 2 layers, hidden 64, the real 151,936 vocabulary)
over random prompts of 64 tokens, greedy, 24 new tokens, one thread; prints one JSON line per batch size with the
median wall time per loop step over the repeats. Before the change a batch of trees kept one drafter copy per row,
so a step ran rows x depth draft forwards; after it, one forward per depth for every row.

    cd CHECKOUT && OMP_NUM_THREADS=1 PYTHONPATH=. python /path/to/run.py --label after
"""

import argparse
import json
import statistics
import time

import torch
from evals.loop_cost import random_batch, tiny_qwen

from semverify import ModelTreeDrafter, get_rule, speculative_generate

parser = argparse.ArgumentParser()
parser.add_argument("--label", required=True)
parser.add_argument("--batches", default="1,8,32")
parser.add_argument("--repeats", type=int, default=3)
args = parser.parse_args()
torch.set_num_threads(1)
target, draft = tiny_qwen(0), tiny_qwen(1)
for model in (target, draft):
    model.generation_config.eos_token_id = None
for batch in map(int, args.batches.split(",")):
    ids, mask = random_batch(target.config.vocab_size, batch, 64)
    times, steps, outputs = [], None, None
    for _ in range(args.repeats + 1):  # the first is a warm-up
        start = time.perf_counter()
        out, stats = speculative_generate(target, ids, attention_mask=mask, rule=get_rule("greedy"), k=8,
                                          drafter=ModelTreeDrafter(draft, budget=24, branch=2, threshold=0.6),
                                          max_new_tokens=24, pad_token_id=0, eos_token_id=None)
        times.append((time.perf_counter() - start) / (stats.steps / batch))
        steps, outputs = stats.steps / batch, out
    print(json.dumps({"label": args.label, "batch": batch, "ms_per_step": 1000 * statistics.median(times[1:]),
                      "samples_ms": [1000 * t for t in times[1:]], "steps_per_row": steps,
                      "output_sum": int(outputs.sum())}), flush=True)
