"""Launch ``python -m sglang.launch_server`` on the tiny CPU pair (a helper, not a test).

SGLang's own launcher (`sglang.test.test_utils.popen_launch_server`) imports its
benchmark package, which needs ``datasets``; the lean SGLang venv has none, so this
is the few lines it takes: start the server, poll ``/health_generate``, and kill the
process tree on exit.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import requests

CPU_ARGS = ["--device", "cpu", "--attention-backend", "reanchor_sdpa", "--disable-cuda-graph", "--dtype", "float32",
            "--mem-fraction-static", "0.3", "--max-total-tokens", "4096", "--random-seed", "0",
            "--skip-server-warmup", "--log-level", "warning"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def launch(root: Path, algorithm: str | None, config: str | None = None, trace: Path | None = None,
           extra_args: list[str] | None = None, timeout: float = 600,
           extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """Yield the base URL of a server on ``root/target`` (REANCHOR with ``root/drafter`` if ``algorithm``)."""
    port = free_port()
    args = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(root / "target"),
            "--host", "127.0.0.1", "--port", str(port), *CPU_ARGS, *(extra_args or [])]
    if algorithm:
        args += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(root / "drafter")]
    env = {**os.environ, "TRITON_INTERPRET": "1", **(extra_env or {})}
    env.pop("SGLANG_REANCHOR_CONFIG", None)
    if config:
        env["SGLANG_REANCHOR_CONFIG"] = config
    if trace:
        env["SGLANG_REANCHOR_TRACE"] = str(trace)
    log = open(root / f"server-{port}.log", "w")
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}):\n{Path(log.name).read_text()[-4000:]}")
            try:
                if requests.get(url + "/health_generate", timeout=30).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not healthy after {timeout} s")
            time.sleep(2)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
