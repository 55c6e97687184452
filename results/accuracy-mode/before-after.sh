#!/usr/bin/env bash
# Before/after a change to batched decoding: step_likelihood at -0.2 in accuracy mode (float32, coupled, T=0.7,
# cap 512), one batch of 8 GSM8K dev problems (0-7), decoded by the code before the change (OLD: a checkout of the
# commit before it) and after it (this checkout), in the order new, old, new, into OUT/new-1, OUT/old-1, OUT/new-2.
# A setting instead of a commit: OLD=. and the "after" method in METHOD (OLD_METHOD: the "before" one).
# Run from the repository root (each run starts in its code's folder, so Python imports that code):
#   OLD=/path/to/checkout OUT=results/accuracy-mode/ride-along bash results/accuracy-mode/before-after.sh
set -euo pipefail
OLD=${OLD:?set OLD to a checkout of the commit before the change}
OUT=$(realpath -m "${OUT:?set OUT to the folder for the three runs}")
OLD_METHOD=${OLD_METHOD:-step_likelihood:min_mean_logprob=-0.2}
METHOD=${METHOD:-$OLD_METHOD}
ROOT=$PWD
args=(compare --accuracy --batch-size 8 --limit 8 --max-new-tokens 512 --do-sample --temperature 0.7 --coupled
      --no-report)
for run in new-1 old-1 new-2; do
  case $run in old*) src=$OLD method=$OLD_METHOD ;; *) src=$PWD method=$METHOD ;; esac
  echo "== $run ($src, $method) $(date -u +%FT%TZ)"
  (cd "$src" && HF_HUB_OFFLINE=1 nice "$ROOT/.venv/bin/python" -m semverify.cli "${args[@]}" --methods "$method" \
    --out "$OUT/$run")
done
