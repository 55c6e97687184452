#!/usr/bin/env bash
# The GPU check: a few minutes on a lent CUDA machine, never part of CI.
#   1. the device tests (tests/semverify/test_device.py): every drafter's tensors stay on the GPU, float32 greedy
#      outputs equal transformers' generate there (batch 1 and a padded batch), coupled sampling is drafter-invariant;
#   2. with the default pair (or TARGET/DRAFT: local folders or hub ids in the cache), float32 greedy exactness
#      of sd, pld and sd_tree against vanilla on 5 GSM8K problems;
#   3. the speed table at batch 1 (bf16) and total tokens/s at batch sizes 1..32 (vanilla against sd).
# Between 1 and 2, always (random weights, nothing to load): `semverify loop-cost`, the loop's bookkeeping per step
# against transformers' plain decoding step, a perfect drafter's speedup and the host syncs per step, on the tiny
# random pair (Qwen vocabulary) and, where CONFIGS is set, on the pair's shapes with random weights.
# Where the pair's weights do not load but its configurations are in CONFIGS (folders target/ and draft/ with
# config.json), steps 2-3 are replaced by scripts/gpu_shapes.py: forward-cost curves, the planner's draft length
# and the target alone's batch throughput on random weights of the same shapes (costs only, no acceptance).
# Usage: bash scripts/gpu-check.sh [OUT]   (OUT defaults to $OUT, else runs/gpu-check)
# It uses the python3 that holds a CUDA torch (PYTHON=... to choose another) and installs semverify into
# it without dependencies or network; steps 2-3 are skipped, and say so, where the models do not load.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-runs/gpu-check}}
py=${PYTHON:-python3}
target=${TARGET:-qwen2.5-coder-1.5b-instruct}
draft=${DRAFT:-qwen2.5-coder-0.5b-instruct}
mkdir -p "$out"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
status=0

step() { echo; echo "== $*"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$py" -c "import torch, transformers as t; print(torch.__version__, torch.version.cuda, t.__version__)"
"$py" -c "import torch; raise SystemExit(0 if torch.cuda.is_available() else 1)" || {
  echo "no CUDA device visible to $py: nothing to check"; exit 1; }
"$py" -m pip install -q --no-deps --no-index --no-build-isolation -e . 2>/dev/null || {
  echo "semverify could not be installed here: importing it from the checkout (PYTHONPATH)"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"; }
semverify=("$py" -m semverify.cli)

step "1. device tests"
"$py" -m pytest -q -p no:cacheprovider tests/semverify/test_device.py 2>&1 | tee "$out/device-tests.log" || status=1

step "1b. loop cost per step against transformers' plain step (random weights, float32)"
"${semverify[@]}" loop-cost --model tiny --device cuda --new-tokens 40 --repeats 3 --out "$out/loop-cost-tiny" \
  || status=1
if [ -n "${CONFIGS:-}" ]; then
  "${semverify[@]}" loop-cost --model "$CONFIGS/target" --draft "$CONFIGS/draft" --random-weights --device cuda \
    --new-tokens 40 --repeats 3 --out "$out/loop-cost-pair-shapes" || status=1
fi

step "2. float32 greedy exactness on the pair ($target, $draft)"
if ! "$py" -c "from semverify.models import load_tokenizer; load_tokenizer('$target'); load_tokenizer('$draft')"; then
  if [ -n "${CONFIGS:-}" ]; then
    step "2-3. the pair's shapes on random weights (forward costs, planned draft length, batch throughput)"
    "$py" scripts/gpu_shapes.py "$CONFIGS/target" "$CONFIGS/draft" "$out/shapes.json" --device cuda || status=1
  else
    echo "the models do not load here: steps 2 and 3 skipped"
  fi
  exit $status
fi
"${semverify[@]}" compare --target "$target" --draft "$draft" --device cuda --dtype float32 \
  --methods vanilla,sd,pld,sd_tree --limit 5 --max-new-tokens 128 --out "$out/exact" --no-report || status=1
"$py" - "$out/exact" <<'EOF' || status=1
import sys
from evals.rows import read_rows
rows = {(r["id"], r["method"]): r["output_ids"] for r in read_rows(sys.argv[1])}
bad = [(p, m) for (p, m), ids in rows.items() if m != "vanilla" and ids != rows[(p, "vanilla")]]
print(f"{len(rows)} rows; lossless outputs that differ from vanilla: {bad or 'none'}")
raise SystemExit(1 if bad else 0)
EOF

step "3. speed at batch 1 (bf16) and throughput at B = 1..32"
"${semverify[@]}" speed --target "$target" --draft "$draft" --device cuda --dtype bfloat16 --limit 5 \
  --max-new-tokens 128 --methods hf_vanilla,hf_sd,sd,hf_pld,pld,sd_tree --out "$out/speed" || status=1
"${semverify[@]}" throughput --target "$target" --draft "$draft" --device cuda --dtype bfloat16 --prompts 32 \
  --batch-sizes 1,2,4,8,16,32 --max-new-tokens 64 --methods vanilla,sd --out "$out/throughput" || status=1
exit $status
