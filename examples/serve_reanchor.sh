#!/usr/bin/env bash
# Serve a target with ReAnchor speculative decoding through SGLang.
#
#   bash examples/serve_reanchor.sh TARGET DRAFTER [extra sglang.launch_server flags]
#
# GPU (the intended use), e.g. Qwen3-8B with its z-lab DFlash drafter:
#   bash examples/serve_reanchor.sh Qwen/Qwen3-8B z-lab/Qwen3-8B-DFlash-b16
#
# CPU (slow: SGLang's Triton kernels run in the interpreter; for trying it out):
#   bash examples/serve_reanchor.sh cpu
# serves SmolLM2-135M-Instruct with the drafter shipped for it (or an untrained one).
#
# ReAnchor's own settings come from $SGLANG_REANCHOR_CONFIG (a JSON object or a JSON
# file), e.g. SGLANG_REANCHOR_CONFIG='{"offsets": [1, 2], "node_budget": 32}'.
# Everything else (overlap off, CUDA graphs off, draft width, ...) is set by the
# plugin; see docs/sglang.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-30000}"

if [ "${1:-}" = "cpu" ]; then
    shift
    export TRITON_INTERPRET=1
    TARGET=$(python -c "from sglang_reanchor.hub import default_target_path; print(default_target_path())")
    DRAFTER=$(python - <<'PY'
from pathlib import Path
from sglang_reanchor.hub import shipped_drafter_path
shipped = shipped_drafter_path()
if shipped is not None:
    print(shipped)
else:  # none shipped in this build: save an untrained one (tokens stay exact, acceptance ~1)
    from sglang_reanchor.hub import default_drafter, default_target_path, load_target
    out = Path("build/untrained-drafter")
    if not (out / "config.json").exists():
        model, _ = load_target(default_target_path())
        default_drafter(model).save_pretrained(out)
    print(out)
PY
)
    exec python -m sglang.launch_server --model-path "$TARGET" \
        --speculative-algorithm REANCHOR --speculative-draft-model-path "$DRAFTER" \
        --device cpu --dtype float32 --mem-fraction-static 0.3 --max-total-tokens 8192 \
        --port "$PORT" "$@"
fi

TARGET="$1"; DRAFTER="$2"; shift 2
exec python -m sglang.launch_server --model-path "$TARGET" \
    --speculative-algorithm REANCHOR --speculative-draft-model-path "$DRAFTER" \
    --port "$PORT" "$@"
