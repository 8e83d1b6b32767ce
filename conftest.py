"""Root pytest configuration: skip doctest collection of modules that import SGLang.

``sglang_reanchor/srt/{spec,worker,outputs,...}.py`` import SGLang at the top (SGLang loads them
through the plugin entry point); the main test venv has no SGLang, so the
``--doctest-modules`` run leaves them out there. tests_sglang/ covers them with the
SGLang venv (scripts/install_sglang.sh).
"""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("sglang") is None:
    collect_ignore += ["sglang_reanchor/srt/spec.py", "sglang_reanchor/srt/worker.py", "sglang_reanchor/srt/cpu_compat.py",
                       "sglang_reanchor/srt/cpu_attention.py", "sglang_reanchor/srt/outputs.py"]
