"""GPU check of the SGLang plugin: plain vs DFLASH vs REANCHOR servers on one target/drafter pair.

    python scripts/gpu_check_sglang.py [--target T --drafter D] [--prompts 16 --max-new-tokens 256]

Needs a CUDA machine with SGLang 0.5.23 and this package installed (``pip install
-e '.[serve]'``). Defaults: SmolLM2-135M-Instruct (``sglang_reanchor.hub``) and the
drafter shipped for it; pass ``--target/--drafter`` for a larger pair, e.g.
Qwen3-8B with z-lab/Qwen3-8B-DFlash-b16 (local folders: the machine may be offline).
Sized for < 8 minutes on one H200 with the defaults: three server launches
(~1 min each) and ``prompts x max_new_tokens`` greedy tokens per server.

Steps:

1. launch ``python -m sglang.launch_server`` three times on the same pair: no
   speculation, ``--speculative-algorithm DFLASH``, ``--speculative-algorithm REANCHOR``;
2. send the same prompts at temperature 0 to each (one at a time, so tokens/s is
   batch-1 latency) and check every output is token-for-token identical;
3. read the acceptance length (``spec_accept_length``: tokens per target forward,
   bonus included) and tokens/s;
4. run examples/frontend_program.py and examples/multiturn_chat.py against the
   REANCHOR server;
5. print a table; exit 1 if an output differs, an example fails, or REANCHOR's
   acceptance length does not beat DFLASH's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Explain how a hash table handles collisions.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? Think step by step.",
    "Summarize the plot of Romeo and Juliet in five sentences.",
    "List the planets of the solar system with one fact each.",
    "What is the difference between TCP and UDP?",
    "Write a haiku about autumn, then explain its imagery.",
    "A train travels 60 km in 45 minutes. What is its speed in km/h? Show your work.",
]


def post(url: str, payload: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except Exception:
            pass
        time.sleep(2)
    raise TimeoutError(f"{url} not healthy after {timeout} s")


def launch(args: argparse.Namespace, algorithm: str | None, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", args.target, "--port", str(port),
           "--mem-fraction-static", "0.35", "--log-level", "warning", "--dtype", args.dtype]
    if algorithm:
        cmd += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", args.drafter]
    if algorithm == "DFLASH":
        # like for like with REANCHOR: synchronous scheduling, no CUDA graphs
        cmd += ["--disable-overlap-schedule", "--disable-cuda-graph"]
    cmd += args.extra
    print("$", " ".join(cmd), flush=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def run_server(args: argparse.Namespace, algorithm: str | None, port: int, prompts: list[str]) -> dict:
    log = Path(args.out) / f"server_{algorithm or 'plain'}.log"
    proc = launch(args, algorithm, port, log)
    url = f"http://127.0.0.1:{port}"
    result: dict = {"name": algorithm or "plain", "outputs": [], "tokens": 0, "seconds": 0.0, "accept": []}
    try:
        wait_healthy(url, proc)
        post(f"{url}/generate", {"text": "warm up", "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
        for prompt in prompts:
            start = time.perf_counter()
            out = post(f"{url}/generate", {"text": prompt, "sampling_params": {
                "max_new_tokens": args.max_new_tokens, "temperature": 0}})
            result["seconds"] += time.perf_counter() - start
            meta = out["meta_info"]
            result["outputs"].append(out.get("output_ids") or out["text"])
            result["tokens"] += meta["completion_tokens"]
            if meta.get("spec_accept_length") is not None:
                result["accept"].append(meta["spec_accept_length"])
        if algorithm == "REANCHOR":
            for example in ("frontend_program.py", "multiturn_chat.py"):
                ex = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--url", url,
                                     "--max-tokens", str(args.example_max_tokens)],
                                    capture_output=True, text=True, timeout=args.example_timeout)
                result[example] = ex.returncode
                print(ex.stdout[-2000:], ex.stderr[-2000:] if ex.returncode else "", flush=True)
    finally:
        stop(proc)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--drafter", default=None, help="DFlash drafter folder (default: the shipped one)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="float32",
                        help="float32 keeps T=0 outputs bit-comparable across verify kernels (bfloat16 may flip near-ties)")
    parser.add_argument("--out", default=str(ROOT / "build" / "gpu_check_sglang"))
    parser.add_argument("--algorithms", default="plain,DFLASH,REANCHOR",
                        help="servers to compare, plain first (CPU smoke run: plain,REANCHOR)")
    parser.add_argument("--example-max-tokens", type=int, default=64)
    parser.add_argument("--example-timeout", type=float, default=300)
    parser.add_argument("extra", nargs="*", help="extra sglang.launch_server flags for every server (after --)")
    args = parser.parse_args()
    if args.target is None:
        from sglang_reanchor.hub import default_target_path, shipped_drafter_path

        args.target = str(default_target_path())
        if args.drafter is None:
            shipped = shipped_drafter_path()
            if shipped is None:
                print("no drafter shipped in this build; pass --drafter", file=sys.stderr)
                return 2
            args.drafter = str(shipped)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    prompts = (PROMPTS * (args.prompts // len(PROMPTS) + 1))[: args.prompts]

    names = args.algorithms.split(",")
    if names[0] != "plain":
        parser.error("--algorithms must start with plain (the reference outputs)")
    results = [run_server(args, None if name == "plain" else name, 31000 + i, prompts)
               for i, name in enumerate(names)]
    by_name = {r["name"]: r for r in results}
    plain = results[0]
    ok = True
    print(f"\n{'server':<10} {'accept len':>10} {'tok/s':>8} {'speedup':>8} {'identical':>9}")
    for r in results:
        same = r["outputs"] == plain["outputs"]
        ok &= same
        accept = sum(r["accept"]) / len(r["accept"]) if r["accept"] else 1.0
        r["mean_accept"] = accept
        tps = r["tokens"] / r["seconds"]
        print(f"{r['name']:<10} {accept:>10.2f} {tps:>8.1f} {tps / (plain['tokens'] / plain['seconds']):>7.2f}x "
              f"{str(same):>9}")
    reanchor = by_name.get("REANCHOR")
    if reanchor is not None:
        for example in ("frontend_program.py", "multiturn_chat.py"):
            print(f"example {example}: {'ok' if reanchor.get(example) == 0 else 'FAILED'}")
            ok &= reanchor.get(example) == 0
    dflash = by_name.get("DFLASH")
    if reanchor is not None and dflash is not None and reanchor["mean_accept"] <= dflash["mean_accept"]:
        print("FAIL: REANCHOR's acceptance length does not beat DFLASH's")
        ok = False
    (Path(args.out) / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
