#!/usr/bin/env bash
# Draft-model trees in a batch before (BEFORE: a checkout of f83b436, one drafter copy per row) and after (this
# checkout) they were batched: run.py in each, alternating before/after twice, one thread; JSON lines to OUT.
# Run from the repository root:  BEFORE=/path/to/f83b436 bash results/loop-cost/tree-drafter/run.sh
set -euo pipefail
BEFORE=${BEFORE:?set BEFORE to a checkout of f83b436}
OUT=${OUT:-results/loop-cost/tree-drafter/samples.jsonl}
ROOT=$PWD SCRIPT=$PWD/results/loop-cost/tree-drafter/run.py
for round in 1 2; do
  for side in before after; do
    src=$ROOT; [[ $side == before ]] && src=$BEFORE
    (cd "$src" && OMP_NUM_THREADS=1 PYTHONPATH=. nice "$ROOT/.venv/bin/python" "$SCRIPT" --label "$side-$round") >> "$OUT"
  done
done
