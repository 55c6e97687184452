#!/usr/bin/env bash
# Before/after a change to batched decoding, in accuracy mode (float32, coupled, T=0.7, cap 512): GSM8K dev problems
# 0..LIMIT-1 (default 8) in batches of BATCH (default 8), decoded by the code before the change (OLD: a checkout of
# the commit before it) and after it (this checkout).
# Sequential (default): new, old, new, into OUT/new-1, OUT/old-1, OUT/new-2.
# TOGETHER=1: old and new at the same time, one thread each, into OUT/old and OUT/new, so that both see the same
# machine however busy it is (each holds its own copy of the models).
# OLD_METHOD: the "before" methods (comma-separated; default step_likelihood at -0.2), METHOD: the "after" ones
# (default the same); NEW_ARGS: options only the new code takes (e.g. "--coupled-noise legacy"); CONFIG: a methods
# file both sides read, whose methods (or vanilla) METHOD and OLD_METHOD then name (relative paths in it resolve in
# each side's folder: link runs/ into the old checkout).
# A setting instead of a commit: OLD=. and the "after" method in METHOD.
# Run from the repository root (each run starts in its code's folder, so Python imports that code):
#   OLD=/path/to/checkout OUT=results/accuracy-mode/ride-along bash results/accuracy-mode/before-after.sh
set -euo pipefail
OLD=${OLD:?set OLD to a checkout of the commit before the change}
OUT=$(realpath -m "${OUT:?set OUT to the folder for the runs}")
OLD_METHOD=${OLD_METHOD:-step_likelihood:min_mean_logprob=-0.2}
METHOD=${METHOD:-$OLD_METHOD}
BATCH=${BATCH:-8}
LIMIT=${LIMIT:-8}
read -r -a new_args <<< "${NEW_ARGS:-}"
config=() select=--methods
if [[ -n ${CONFIG:-} ]]; then config=(--config "$(realpath "$CONFIG")" --methods vanilla) select=--only; fi
ROOT=$PWD
mkdir -p "$(dirname "$OUT")"
args=(compare --accuracy --batch-size "$BATCH" --limit "$LIMIT" --max-new-tokens 512 --do-sample --temperature 0.7
      --coupled --no-report)

decode() {  # decode SIDE RUN: one run of the old or new code into OUT/RUN
  local src=$ROOT method=$METHOD extra=("${new_args[@]}")
  if [[ $1 == old ]]; then src=$OLD method=$OLD_METHOD extra=(); fi
  echo "== $2 ($src, $method) $(date -u +%FT%TZ)"
  (cd "$src" && HF_HUB_OFFLINE=1 nice "$ROOT/.venv/bin/python" -m semverify.cli "${args[@]}" "${config[@]}" "${extra[@]}" \
    "$select" "$method" --out "$OUT/$2")
}

if [[ ${TOGETHER:-0} == 1 ]]; then
  export OMP_NUM_THREADS=1
  decode old old > "$OUT.old.log" 2>&1 &
  decode new new > "$OUT.new.log" 2>&1 &
  wait
  echo "== both done $(date -u +%FT%TZ)"
else
  for run in new-1 old-1 new-2; do
    decode "${run%-*}" "$run"
  done
fi
