"""KV memory of a batched cache whose rows keep different numbers of draft tokens (issue 62's KV goal).

Decodes B random 64-token prompts on the tiny random Qwen2 (2 layers, hidden 64, 151,936-token vocabulary) with
loop-cost's ragged oracle (row r, n tokens into its output, keeps (r + n // 5) mod 5 of its 4 draft tokens), greedy,
100 new tokens, one thread, and prints per B one JSON line: the target cache's width (holes included) over the
longest row's prompt and output, at every step (last, max, mean), tau, and whether the output equals
`model.generate`'s. Run in a checkout (the code it measures) with this repository's evals on the path:

    cd CHECKOUT && OMP_NUM_THREADS=1 PYTHONPATH=. python /path/to/run.py --label after
"""

import argparse
import json

import torch
from evals.loop_cost import OracleDrafter, kv_width, random_batch, tiny_qwen

import semverify
from semverify import generation

parser = argparse.ArgumentParser()
parser.add_argument("--label", required=True)
args = parser.parse_args()
torch.set_num_threads(1)
target = tiny_qwen(0)
vocab = target.config.vocab_size
loop = generation.speculative_generate
for batch in (8, 32):
    ids, mask = random_batch(vocab, batch, 64)
    greedy = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=100, **greedy)[:, 64:]
    ratios = []

    def watched(*a, **kw):
        return loop(*a, **kw, on_step=lambda e: ratios.append(kv_width(e.target_cache) / e.sequences.shape[1]))

    generation.speculative_generate = watched
    out = semverify.generate(target, ids, attention_mask=mask, drafter=OracleDrafter(expected).as_ragged(vocab),
                             num_assistant_tokens=4, max_new_tokens=100, return_dict_in_generate=True, **greedy)
    generation.speculative_generate = loop
    print(json.dumps({"label": args.label, "batch": batch, "tau": out.spec_stats.tau,
                      "identical_to_generate": bool(torch.equal(out.sequences[:, 64:], expected)),
                      "kv_over_live_last": ratios[-1], "kv_over_live_max": max(ratios),
                      "kv_over_live_mean": sum(ratios) / len(ratios), "steps": len(ratios)}), flush=True)
