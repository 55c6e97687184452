"""Where a batch's time went, per run folder of an A/B (rows.rank0.jsonl): wall time, tokens, verifications (row
steps; the longest row's), positions verified, draft and verification time summed over rows, correct answers,
and whether the runs wrote the same tokens. Run from the repository root:
  python results/accuracy-mode/step-rounds/profile.py results/accuracy-mode/step-rounds/{new-1,old-1,new-2}"""

import json
import sys
from pathlib import Path

outputs = {}
print("| run | method | batch wall (s) | tokens | tokens/s | verifications (longest row) | row verifications "
      "| positions verified | draft time (s, over rows) | verification time (s, over rows) | correct |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for folder in map(Path, sys.argv[1:]):
    rows = [json.loads(line) for line in open(folder / "rows.rank0.jsonl")]
    outputs[str(folder)] = {r["id"]: r["output_ids"] for r in rows}
    wall, tokens = rows[0]["batch"]["wall"], sum(r["new_tokens"] for r in rows)
    print(f"| {folder.name} | `{rows[0]['method']}` | {wall:.0f} | {tokens} | {tokens / wall:.2f} "
          f"| {max(r['steps'] for r in rows)} | {sum(r['steps'] for r in rows)} "
          f"| {sum(sum(r['draft_lengths']) + r['steps'] for r in rows)} | {sum(r['draft_time'] for r in rows):.0f} "
          f"| {sum(r['verify_time'] for r in rows):.0f} | {sum(r['grades']['math_verify'] for r in rows)} of {len(rows)} |")
first, *others = outputs.values()
for name, out in zip(list(outputs)[1:], others):
    same = sum(out.get(i) == ids for i, ids in first.items())
    print(f"\n{name}: {same} of {len(first)} outputs token-identical to {list(outputs)[0]}")
