"""Issue 62's accuracy-mode before/after, from the rows: per method, outputs per hour of each side's batch (the
batch's wall time; old and new decoded at the same time, one thread each), whether the two sides' outputs are
token-identical (and equal to the 500-table's rows of the same problems), and, in lossless-batch4, whether the
lossless methods' outputs equal `vanilla`'s in the same coupled batches. `sense/` holds the SENSE pair (a batch of 8
on a smaller store, see NOTES.md), read as more rows of each side. Writes compare.json and compare.md here.

    python results/loop-cost/accuracy-mode/compare.py
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
TABLE = HERE.parents[1] / "gsm8k-500" / "rows.rank0.jsonl"


def rows(path: Path) -> dict:
    return {(r["method"], r["id"]): r for r in map(json.loads, path.open())} if path.exists() else {}


def per_hour(side: dict, method: str) -> float | None:
    batches = {(r["batch"]["first"], r["batch"]["wall"]) for (m, _), r in side.items() if m == method}
    outputs = sum(1 for m, _ in side if m == method)
    return 3600 * outputs / sum(wall for _, wall in batches) if batches else None


(old, new), table = ({**rows(HERE / side / "rows.rank0.jsonl"), **rows(HERE / "sense" / side / "rows.rank0.jsonl")}
                   for side in ("old", "new")), rows(TABLE)
lossless = rows(HERE / "lossless-batch4" / "rows.rank0.jsonl")
result = {"before_after": {}, "lossless_in_batch": {}}
for method in sorted({m for m, _ in old} & {m for m, _ in new}):
    both = [key for key in old if key[0] == method and key in new]
    result["before_after"][method] = {
        "problems": len(both), "outputs_per_hour_old": per_hour(old, method), "outputs_per_hour_new": per_hour(new, method),
        "identical_old_new": sum(old[k]["output_ids"] == new[k]["output_ids"] for k in both),
        "identical_to_500_table": sum(new[k]["output_ids"] == table[k]["output_ids"] for k in both if k in table),
        "in_500_table": sum(k in table for k in both)}
for method in sorted({m for m, _ in lossless} - {"vanilla"}):
    keys = [key for key in lossless if key[0] == method and ("vanilla", key[1]) in lossless]
    result["lossless_in_batch"][method] = {
        "problems": len(keys),
        "identical_to_vanilla": sum(lossless[k]["output_ids"] == lossless[("vanilla", k[1])]["output_ids"] for k in keys),
        "tau": sum(lossless[k]["tau"] for k in keys) / len(keys) if keys else None}
(HERE / "compare.json").write_text(json.dumps(result, indent=2))
lines = ["| method | problems | outputs/h before | outputs/h after | after / before | old = new | = 500-table |",
         "|---|---|---|---|---|---|---|"]
for method, r in result["before_after"].items():
    ratio = (r["outputs_per_hour_new"] / r["outputs_per_hour_old"]) if r["outputs_per_hour_old"] else float("nan")
    lines.append(f"| {method} | {r['problems']} | {r['outputs_per_hour_old']:.1f} | {r['outputs_per_hour_new']:.1f} | "
                 f"{ratio:.3f} | {r['identical_old_new']} of {r['problems']} | "
                 + (f"{r['identical_to_500_table']} of {r['in_500_table']} |" if r["in_500_table"] else "not in it |"))
lines += ["", "| lossless method (batch of 4, coupled) | problems | equal to vanilla | tau |", "|---|---|---|---|"]
for method, r in result["lossless_in_batch"].items():
    lines.append(f"| {method} | {r['problems']} | {r['identical_to_vanilla']} of {r['problems']} | "
                 + (f"{r['tau']:.2f} |" if r["tau"] is not None else "- |"))
(HERE / "compare.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
