"""The draft phase of step-sized drafts in a batch of 32 (the 0.5B draft model, float32, greedy, 3 rounds of
drafts whose lengths are drawn from the steps of vanilla's gsm8k-500 outputs), with rows that stop drafting
leaving the forwards (RowSubset) and without (its `keep` disabled), in the order on, off, off, on.
Run from the repository root at the code it measured (git checkout af427cd): HF_HUB_OFFLINE=1 python
results/accuracy-mode/row-work/draft_phase.py. It patches RowSubset and imports semverify.sampling, both gone since
the engine package and batched drafting: kept as the record of that measurement, not runnable on later code."""

import json
import random
import statistics
import time

import torch

from semverify.drafters import model as model_drafter
from semverify.models import load_model
from semverify.sampling import Sampler

torch.set_num_threads(2)
model, tok = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32", role="draft")
vanilla = [row for row in map(json.loads, open("results/gsm8k-500/rows.rank0.jsonl")) if row["method"] == "vanilla"]
steps = [min(128, len(tok(step)["input_ids"])) for row in vanilla for step in row["output"].split("\n\n")]
print("steps", len(steps), "median", statistics.median(steps), "mean", statistics.mean(steps))
random.seed(0)
prompts = [torch.tensor(tok(row["output"])["input_ids"][:300]) for row in vanilla][:32]
rounds = [[random.choice(steps) for _ in range(32)] for _ in range(3)]
print("per round: max", [max(k) for k in rounds], "mean", [statistics.mean(k) for k in rounds])
keep = model_drafter.RowSubset.keep


def run(narrow: bool) -> float:
    model_drafter.RowSubset.keep = keep if narrow else (lambda self, rows: None)
    drafter, sequences = model_drafter.ModelDrafter(model), [p.clone() for p in prompts]
    drafter.reset_rows(sequences)
    start = time.perf_counter()
    with torch.inference_mode():
        for ks in rounds:
            draft, _ = drafter.draft_rows(sequences, ks, Sampler(), [None] * 32, keep_hidden=True)
            accepted = draft.lengths.tolist()
            sequences = [torch.cat([s, draft.tokens[i, :a], torch.tensor([13])]) for i, (s, a) in
                         enumerate(zip(sequences, accepted))]
            drafter.commit_rows(accepted, torch.tensor([[13]] * 32))
    return time.perf_counter() - start


seconds = {True: [], False: []}
for narrow in (True, False, False, True):
    seconds[narrow].append(run(narrow))
    print("narrow" if narrow else "full", f"{seconds[narrow][-1]:.1f} s", flush=True)
on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
print(f"median narrow {on:.1f} full {off:.1f} ratio {off / on:.2f}")
