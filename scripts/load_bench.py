"""Serving under load on CPU: plain SGLang, REANCHOR's chain and REANCHOR trees, side by side.

Run with the SGLang venv (``bash scripts/install_sglang.sh``)::

    TRITON_INTERPRET=1 build/sglang-venv/bin/python scripts/load_bench.py --out OUT_DIR \
        --cost-profile PROFILE.json     # a `python -m sglang_reanchor.bench cost` profile of this machine

(``results/archive/v7/load`` was made so with the profile ``results/archive/v6/cost/cost_profile.json``;
``--methods`` without ``reanchor-cost`` needs no profile.)

For each method a ``python -m sglang.launch_server`` starts on the default pair
(SmolLM2-135M-Instruct + the shipped drafter, ``--attention-backend reanchor_sdpa``),
then closed-loop clients run at each concurrency ``c``: ``c`` threads send
``--requests`` requests in all (greedy, ``ignore_eos``, ``--max-new-tokens`` each)
to ``/generate``. Per (method, c) it records requests/s, output tokens/s, mean
latency, and the tokens of every answer; answers are compared across methods (at T=0
they should be equal; bfloat16 near-ties can differ, so the count is reported, not
asserted). Writes ``load.json`` and ``load.md``; methods are run one after another,
each alone on the machine.

Methods (``--methods``): ``plain`` (no speculation), ``chain`` (REANCHOR with
``--chain-config``, by default ``{"offsets": []}``: DFlash's chain), ``reanchor`` (the config in
``--reanchor-config``); ``chain-batch`` and ``reanchor-batch`` (the same plus ``batch_node_budget`` =
``--batch-node-budget``) and ``chain-cost`` and ``reanchor-cost`` (the same with
``$SGLANG_REANCHOR_COST_PROFILE`` = ``--cost-profile``, required for them: each round's per-request
budget chosen for the batch from the measured cost curve, `sglang_reanchor.budget.BatchBudget`);
``defaults`` (REANCHOR with nothing set: what the plugin serves on this machine, `settings.served_config`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests_sglang"))
from http_server import launch  # noqa: E402  (the servers' launcher, shared with the tests)

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in all?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain why the sky is blue in two sentences.",
    "What is the capital of France, and what is it famous for?",
    "Give three tips for writing clear emails.",
    "A train travels 60 km in 45 minutes. What is its average speed in km/h?",
    "Write a haiku about autumn leaves.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "How many seconds are there in a day? Show your work.",
    "Describe photosynthesis to a ten-year-old.",
    "Write a SQL query that counts the rows of a table named users.",
    "What are the main causes of inflation?",
    "Translate 'good morning, how are you?' into Spanish.",
    "List the planets of the solar system in order from the sun.",
    "Why do we have seasons on Earth?",
]


def chat(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def run_level(url: str, concurrency: int, num_requests: int, max_new: int) -> dict:
    """``num_requests`` requests from ``concurrency`` closed-loop clients; figures and answers."""
    def one(i: int) -> tuple[int, list[int], float]:
        t0 = time.perf_counter()
        r = requests.post(url + "/generate", json={
            "text": chat(QUESTIONS[i % len(QUESTIONS)]),
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True},
        }, timeout=3600)
        r.raise_for_status()
        out = r.json()
        return i, out["output_ids"], time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, range(num_requests)))
    wall = time.perf_counter() - t0
    tokens = sum(len(ids) for _, ids, _ in results)
    return {"concurrency": concurrency, "requests": num_requests, "seconds": wall,
            "requests_per_s": num_requests / wall, "tokens_per_s": tokens / wall,
            "mean_latency_s": statistics.mean(t for _, _, t in results),
            "answers": {str(i): ids for i, ids, _ in results}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, default=None, help="HF target folder (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--drafter", type=Path, default=None, help="z-lab drafter folder (default: the shipped one)")
    ap.add_argument("--methods", nargs="+", default=["plain", "chain", "reanchor", "reanchor-batch", "reanchor-cost"],
                    choices=["plain", "defaults",
                             *(f"{m}{v}" for m in ("chain", "reanchor") for v in ("", "-batch", "-cost"))])
    ap.add_argument("--reanchor-config", default='{"policy": "offset", "offsets": [1, 2, 3], '
                    '"node_budget": 8, "max_depth": 3}', help="SGLANG_REANCHOR_CONFIG of 'reanchor'")
    ap.add_argument("--chain-config", default='{"offsets": [], "max_depth": 6}',
                    help="SGLANG_REANCHOR_CONFIG of 'chain'")
    ap.add_argument("--batch-node-budget", type=int, default=16, help="added to --reanchor-config for 'reanchor-batch'")
    ap.add_argument("--cost-profile", type=Path, default=None,
                    help="`bench cost` profile of 'reanchor-cost' (measured on this machine, same dtype); "
                    "required when --methods includes reanchor-cost")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--requests", type=int, default=16, help="requests per concurrency level (at least c)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--pack-linears", action="store_true",
                    help="every server, plain included, runs float32 CPU linears on oneDNN weights packed once "
                    "($SGLANG_REANCHOR_PACK_LINEARS=1, sglang_reanchor/srt/packed_linears.py)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    costed = [m for m in args.methods if m.endswith("-cost")]
    if costed and args.cost_profile is None:
        ap.error(f"--cost-profile is required for the methods {', '.join(costed)} (a `python -m sglang_reanchor.bench "
                 "cost` profile measured on this machine); or leave them out of --methods")
    if args.cost_profile is not None and not args.cost_profile.is_file():
        ap.error(f"--cost-profile {args.cost_profile} is not a file")

    from sglang_reanchor.hub import default_target_path, shipped_drafter_path

    target = args.target or default_target_path()
    drafter = args.drafter or shipped_drafter_path()
    configs: dict[str, str | None] = {"plain": None, "defaults": None}
    envs: dict[str, dict[str, str]] = {}
    for name, config in (("chain", args.chain_config), ("reanchor", args.reanchor_config)):
        configs[name] = configs[f"{name}-cost"] = config
        configs[f"{name}-batch"] = json.dumps({**json.loads(config), "batch_node_budget": args.batch_node_budget})
        if args.cost_profile:
            envs[f"{name}-cost"] = {"SGLANG_REANCHOR_COST_PROFILE": str(args.cost_profile.resolve())}
    os.environ.pop("SGLANG_REANCHOR_COST_PROFILE", None)  # 'defaults' serves what the plugin chooses, nothing set
    os.environ.pop("SGLANG_REANCHOR_PACK_LINEARS", None)
    if args.pack_linears:  # for every method alike, so the ratios compare like with like
        envs = {m: {**envs.get(m, {}), "SGLANG_REANCHOR_PACK_LINEARS": "1"} for m in args.methods}
    server_args = ["--dtype", args.dtype, "--max-total-tokens", "16384", "--max-running-requests", "16",
                   "--mem-fraction-static", "0.5"]
    report: dict = {"meta": {"target": str(target), "drafter": str(drafter), "max_new_tokens": args.max_new_tokens,
                             "requests": args.requests, "dtype": args.dtype, "command": " ".join(sys.argv),
                             "configs": configs, "cost_profile": str(args.cost_profile),
                             "packed_linears": args.pack_linears}, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "target").symlink_to(Path(target).resolve())
        (root / "drafter").symlink_to(Path(drafter).resolve())
        for method in args.methods:
            algorithm = None if method == "plain" else "REANCHOR"
            print(f"== {method}: starting the server", flush=True)
            with launch(root, algorithm, configs[method], extra_args=server_args, timeout=1200,
                        extra_env=envs.get(method)) as url:
                run_level(url, 1, 2, 8)  # warm-up
                levels = []
                for c in args.concurrency:
                    level = run_level(url, c, max(args.requests, c), args.max_new_tokens)
                    levels.append(level)
                    print(f"   c={c:2d}: {level['requests_per_s']:.2f} req/s, {level['tokens_per_s']:.1f} tok/s, "
                          f"latency {level['mean_latency_s']:.1f} s", flush=True)
            report["runs"][method] = levels
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "load.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    runs = report["runs"]
    methods = list(runs)
    base = runs.get("plain")
    lines = ["# REANCHOR under load (CPU)", "",
             f"Target `{report['meta']['target']}`, drafter `{report['meta']['drafter']}`, {report['meta']['dtype']}, "
             f"{report['meta']['requests']} requests per level (or c), {report['meta']['max_new_tokens']} new tokens "
             "each (greedy, ignore_eos), closed-loop clients; one server at a time"
             + ("; every server with float32 linears packed for oneDNN" if report["meta"].get("packed_linears") else "")
             + ".", "",
             "Configs: " + ", ".join(f"`{m}` = `{c}`" for m, c in report["meta"]["configs"].items() if m in runs), "",
             "## Output tokens/s (x plain)", "", "| concurrency | " + " | ".join(methods) + " |",
             "|---" * (len(methods) + 1) + "|"]
    for i, level in enumerate(runs[methods[0]]):
        cells = []
        for m in methods:
            t = runs[m][i]["tokens_per_s"]
            cells.append(f"{t:.1f}" + (f" ({t / base[i]['tokens_per_s']:.2f}x)" if base and m != "plain" else ""))
        lines.append(f"| {level['concurrency']} | " + " | ".join(cells) + " |")
    lines += ["", "## Requests/s and mean latency (s)", "", "| concurrency | " + " | ".join(methods) + " |",
              "|---" * (len(methods) + 1) + "|"]
    for i, level in enumerate(runs[methods[0]]):
        lines.append(f"| {level['concurrency']} | " + " | ".join(
            f"{runs[m][i]['requests_per_s']:.2f} / {runs[m][i]['mean_latency_s']:.1f}" for m in methods) + " |")
    if base:
        lines += ["", "## Answers equal to plain SGLang's (T = 0)", "", "| method | equal / all |", "|---|---|"]
        for m in methods:
            if m == "plain":
                continue
            pairs = [(a, runs[m][i]["answers"][k]) for i, lv in enumerate(base) for k, a in lv["answers"].items()]
            lines.append(f"| {m} | {sum(a == b for a, b in pairs)} / {len(pairs)} |")
    lines += ["", "```", report["meta"]["command"], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
