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
each alone on the machine. On a shared machine whose speed drifts by more than the
differences measured, ``--interleave R`` keeps every server up (idle ones sleep) and
measures each level ``R`` times, every method in turn: ratios come from neighbouring
measurements.

Methods (``--methods``): ``plain`` (no speculation), ``plain-sync`` (the same with
``--disable-overlap-schedule``: the synchronous event loop REANCHOR's worker runs in), ``chain`` (REANCHOR with
``--chain-config``, by default ``{"offsets": []}``: DFlash's chain), ``reanchor`` (the config in
``--reanchor-config``); ``chain-batch`` and ``reanchor-batch`` (the same plus ``batch_node_budget`` =
``--batch-node-budget``) and ``chain-cost`` and ``reanchor-cost`` (the same with
``$SGLANG_REANCHOR_COST_PROFILE`` = ``--cost-profile``, required for them: each round's per-request
budget chosen for the batch from the measured cost curve, `sglang_reanchor.budget.BatchBudget`);
``defaults`` (REANCHOR with nothing set: what the plugin serves on this machine, `settings.served_config`).

Code A/B: ``--tree LABEL=SOURCE`` names a version of this package (a folder holding ``sglang_reanchor/``, or a git
revision of this repository, exported once with ``git archive``); a method written ``METHOD@LABEL`` serves from
it (its server's ``PYTHONPATH`` is that folder), so one run measures two versions side by side, e.g.::

    load_bench.py --tree before=HEAD~1 --tree after=. --methods plain reanchor-cost@before reanchor-cost@after \
        --baseline reanchor-cost@before --interleave 3 --concurrency 1 8 ...

With ``--interleave`` the two versions' servers are up together and measured in turn, so the
ratios compare neighbouring measurements: the way to see a change of a few percent on a drifting host.

``--trace``: every REANCHOR server writes its rounds (budget, tokens, wall time, what the cost budget
expected) to ``OUT/trace_METHOD.jsonl``; ``scripts/budget_trace.py`` sets expected beside delivered.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
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


BASE_METHODS = ["plain", "plain-sync", "defaults",
                *(f"{m}{v}" for m in ("chain", "reanchor") for v in ("", "-batch", "-cost"))]


def parse_trees(specs: list[str], repo: Path, scratch: Path) -> dict[str, Path]:
    """``LABEL=SOURCE`` pairs as ``{label: folder}``: SOURCE a folder holding ``sglang_reanchor/``, or a git
    revision of ``repo`` whose ``sglang_reanchor/`` is exported under ``scratch/LABEL``."""
    trees: dict[str, Path] = {}
    for spec in specs:
        label, sep, source = spec.partition("=")
        if not sep or not label.isidentifier() or not source:
            raise ValueError(f"--tree takes LABEL=SOURCE (LABEL a name such as 'before', SOURCE a folder or a git "
                             f"revision), got {spec!r}")
        if label in trees:
            raise ValueError(f"--tree label {label!r} given twice")
        folder = Path(source)
        if folder.is_dir():
            if not (folder / "sglang_reanchor" / "__init__.py").is_file():
                raise ValueError(f"--tree {spec}: {folder} holds no sglang_reanchor/ package")
            trees[label] = folder.resolve()
            continue
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{source}^{{commit}}"],
                             capture_output=True, text=True)
        if rev.returncode:
            raise ValueError(f"--tree {spec}: {source!r} is neither a folder nor a git revision of {repo}")
        archive = subprocess.run(["git", "-C", str(repo), "archive", rev.stdout.strip(), "sglang_reanchor"],
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(scratch / label, filter="data")
        trees[label] = scratch / label
    return trees


def split_method(method: str, trees: dict[str, Path]) -> tuple[str, str | None]:
    """``"reanchor-cost@before"`` -> ``("reanchor-cost", "before")``; a clear error for an unknown name or label."""
    base, _, label = method.partition("@")
    if base not in BASE_METHODS:
        raise ValueError(f"--methods: unknown method {base!r} in {method!r}; allowed: {', '.join(BASE_METHODS)} "
                         "(each optionally @LABEL of a --tree)")
    if label and label not in trees:
        raise ValueError(f"--methods {method}: no --tree labelled {label!r} (labels: {', '.join(trees) or 'none'})")
    return base, label or None


def tree_env(label: str | None, trees: dict[str, Path]) -> dict[str, str]:
    """The environment a server of ``METHOD@label`` adds: its tree first on ``PYTHONPATH`` (ahead of the
    installed package, whose editable finder comes after ``sys.path``); nothing without a label."""
    return {"PYTHONPATH": str(trees[label])} if label else {}


def trace_path(out: Path, method: str) -> Path:
    """Where ``--trace`` has ``method``'s server write its rounds (plain servers write none)."""
    return (out / f"trace_{method.replace('@', '_')}.jsonl").resolve()


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
                    help=f"any of {', '.join(BASE_METHODS)}, each optionally @LABEL of a --tree")
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=SOURCE",
                    help="a version of the package for methods written METHOD@LABEL: a folder holding "
                    "sglang_reanchor/, or a git revision of this repository (exported with git archive)")
    ap.add_argument("--baseline", default=None,
                    help="the method the others' ratios and answers are compared with (default: plain, if run)")
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
    ap.add_argument("--interleave", type=int, default=0, metavar="R",
                    help="keep every method's server up (idle ones sleep) and measure each level R times, "
                    "every method in turn, the order rotated each repeat: the machine's drift falls on all "
                    "methods alike; figures are the medians (default 0: one server at a time)")
    ap.add_argument("--trace", action="store_true",
                    help="REANCHOR servers write $SGLANG_REANCHOR_TRACE to OUT/trace_METHOD.jsonl (one line per "
                         "request per round; read them with scripts/budget_trace.py)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if len(set(args.methods)) != len(args.methods):
        ap.error(f"--methods names a method twice: {args.methods}")
    scratch = tempfile.TemporaryDirectory(prefix="load_bench_trees_")  # removed when the run ends
    try:
        trees = parse_trees(args.tree, HERE.parent, Path(scratch.name))
        bases = {m: split_method(m, trees) for m in args.methods}
    except ValueError as e:
        ap.error(str(e))
    if args.baseline is not None and args.baseline not in args.methods:
        ap.error(f"--baseline {args.baseline} is not one of --methods ({', '.join(args.methods)})")
    costed = [m for m in args.methods if bases[m][0].endswith("-cost")]
    if costed and args.cost_profile is None:
        ap.error(f"--cost-profile is required for the methods {', '.join(costed)} (a `python -m sglang_reanchor.bench "
                 "cost` profile measured on this machine); or leave them out of --methods")
    if args.interleave < 0:
        ap.error(f"--interleave must be >= 0 (repeats; 0 runs one server at a time), got {args.interleave}")
    if args.cost_profile is not None and not args.cost_profile.is_file():
        ap.error(f"--cost-profile {args.cost_profile} is not a file")

    from sglang_reanchor.hub import default_target_path, shipped_drafter_path

    target = args.target or default_target_path()
    drafter = args.drafter or shipped_drafter_path()
    configs: dict[str, str | None] = {"plain": None, "plain-sync": None, "defaults": None}
    envs: dict[str, dict[str, str]] = {}
    for name, config in (("chain", args.chain_config), ("reanchor", args.reanchor_config)):
        configs[name] = configs[f"{name}-cost"] = config
        configs[f"{name}-batch"] = json.dumps({**json.loads(config), "batch_node_budget": args.batch_node_budget})
        if args.cost_profile:
            envs[f"{name}-cost"] = {"SGLANG_REANCHOR_COST_PROFILE": str(args.cost_profile.resolve())}
    os.environ.pop("SGLANG_REANCHOR_COST_PROFILE", None)  # 'defaults' serves what the plugin chooses, nothing set
    os.environ.pop("SGLANG_REANCHOR_PACK_LINEARS", None)
    os.environ.pop("SGLANG_REANCHOR_TRACE", None)
    method_envs = {m: {**envs.get(base, {}), **tree_env(label, trees),
                       # for every method alike, so the ratios compare like with like
                       **({"SGLANG_REANCHOR_PACK_LINEARS": "1"} if args.pack_linears else {}),
                       **({"SGLANG_REANCHOR_TRACE": str(trace_path(args.out, m))} if args.trace else {})}
                   for m, (base, label) in bases.items()}
    if args.trace:
        args.out.mkdir(parents=True, exist_ok=True)
        for m in args.methods:
            trace_path(args.out, m).unlink(missing_ok=True)  # the trace appends
    server_args = ["--dtype", args.dtype, "--max-total-tokens", "16384", "--max-running-requests", "16",
                   "--mem-fraction-static", "0.5"]
    report: dict = {"meta": {"target": str(target), "drafter": str(drafter), "max_new_tokens": args.max_new_tokens,
                             "requests": args.requests, "dtype": args.dtype, "command": " ".join(sys.argv),
                             "configs": configs, "cost_profile": str(args.cost_profile),
                             "packed_linears": args.pack_linears,
                             "trees": {label: spec.partition("=")[2] for label, spec in zip(trees, args.tree)},
                             "baseline": args.baseline or ("plain" if "plain" in args.methods else None)},
              "runs": {}}
    if args.interleave:  # idle servers wait on their sockets instead of polling them
        server_args += ["--sleep-on-idle"]
        report["meta"]["interleave"] = args.interleave

    def server(stack: ExitStack, root: Path, method: str) -> str:
        base = bases[method][0]
        algorithm = None if base.startswith("plain") else "REANCHOR"
        sync = ["--disable-overlap-schedule"] if base == "plain-sync" else []
        print(f"== {method}: starting the server", flush=True)
        url = stack.enter_context(launch(root, algorithm, configs[base], extra_args=server_args + sync,
                                         timeout=1200, extra_env=method_envs[method]))
        run_level(url, 1, 2, 8)  # warm-up
        return url

    def level(url: str, method: str, c: int) -> dict:
        out = run_level(url, c, max(args.requests, c), args.max_new_tokens)
        print(f"   {method} c={c:2d}: {out['requests_per_s']:.2f} req/s, {out['tokens_per_s']:.1f} tok/s, "
              f"latency {out['mean_latency_s']:.1f} s", flush=True)
        return out

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "target").symlink_to(Path(target).resolve())
        (root / "drafter").symlink_to(Path(drafter).resolve())
        if not args.interleave:  # one server at a time, all its levels
            for method in args.methods:
                with ExitStack() as stack:
                    url = server(stack, root, method)
                    report["runs"][method] = [level(url, method, c) for c in args.concurrency]
        else:  # every server up; each level measured for every method in turn, the order rotated each repeat
            with ExitStack() as stack:
                urls = {method: server(stack, root, method) for method in args.methods}
                reps: dict[str, list[list[dict]]] = {m: [[] for _ in args.concurrency] for m in args.methods}
                for rep in range(args.interleave):
                    order = args.methods[rep % len(args.methods):] + args.methods[:rep % len(args.methods)]
                    for i, c in enumerate(args.concurrency):
                        for method in order:
                            reps[method][i].append(level(urls[method], method, c))
            report["runs"] = {m: [merge_repeats(r) for r in reps[m]] for m in args.methods}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "load.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def merge_repeats(repeats: list[dict]) -> dict:
    """One level's interleaved repeats as one: the median of each figure, every repeat's figures
    under ``"repeats"``, the first repeat's answers (at T = 0 every repeat's should be the same;
    ``answers_stable`` says whether they were)."""
    merged = {k: statistics.median(r[k] for r in repeats)
              for k in ("seconds", "requests_per_s", "tokens_per_s", "mean_latency_s")}
    return {"concurrency": repeats[0]["concurrency"], "requests": repeats[0]["requests"], **merged,
            "repeats": [{k: v for k, v in r.items() if k != "answers"} for r in repeats],
            "answers": repeats[0]["answers"],
            "answers_stable": all(r["answers"] == repeats[0]["answers"] for r in repeats)}


def ratio_to(level: dict, base: dict) -> str:
    """``level``'s tokens/s over ``base``'s: interleaved, the median of each repeat's ratio and their range."""
    if "repeats" not in level:
        return f"{level['tokens_per_s'] / base['tokens_per_s']:.2f}x"
    ratios = [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(level["repeats"], base["repeats"])]
    return f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def markdown(report: dict) -> str:
    runs = report["runs"]
    methods = list(runs)
    baseline = report["meta"].get("baseline", "plain")
    base = runs.get(baseline) if baseline else None
    trees = report["meta"].get("trees") or {}
    lines = ["# REANCHOR under load (CPU)", "",
             f"Target `{report['meta']['target']}`, drafter `{report['meta']['drafter']}`, {report['meta']['dtype']}, "
             f"{report['meta']['requests']} requests per level (or c), {report['meta']['max_new_tokens']} new tokens "
             "each (greedy, ignore_eos), closed-loop clients; "
             + (f"every server up, each level measured {report['meta']['interleave']} times, every method in turn "
                "(medians" + (f"; x {baseline}: the median of each repeat's ratio, its range in brackets)" if base
                              else ")")
                if report["meta"].get("interleave") else "one server at a time")
             + ("; every server with float32 linears packed for oneDNN" if report["meta"].get("packed_linears") else "")
             + ".", "",
             "Configs: " + ", ".join(f"`{m}` = `{c}`" for m, c in report["meta"]["configs"].items()
                                     if m in {r.partition("@")[0] for r in runs}), "",
             *([("Code versions: " + ", ".join(f"`@{label}` = `{source}`" for label, source in trees.items())), ""]
               if trees else []),
             "## Output tokens/s" + (f" (x {baseline})" if base else ""), "", "| concurrency | " + " | ".join(methods) + " |",
             "|---" * (len(methods) + 1) + "|"]
    for i, level in enumerate(runs[methods[0]]):
        cells = []
        for m in methods:
            cell = f"{runs[m][i]['tokens_per_s']:.1f}"
            if base and m != baseline:
                cell += f" ({ratio_to(runs[m][i], base[i])})"
            cells.append(cell)
        lines.append(f"| {level['concurrency']} | " + " | ".join(cells) + " |")
    lines += ["", "## Requests/s and mean latency (s)", "", "| concurrency | " + " | ".join(methods) + " |",
              "|---" * (len(methods) + 1) + "|"]
    for i, level in enumerate(runs[methods[0]]):
        lines.append(f"| {level['concurrency']} | " + " | ".join(
            f"{runs[m][i]['requests_per_s']:.2f} / {runs[m][i]['mean_latency_s']:.1f}" for m in methods) + " |")
    if base:
        lines += ["", f"## Answers equal to {baseline}'s (T = 0)", "", "| method | equal / all |", "|---|---|"]
        for m in methods:
            if m == baseline:
                continue
            pairs = [(a, runs[m][i]["answers"][k]) for i, lv in enumerate(base) for k, a in lv["answers"].items()]
            lines.append(f"| {m} | {sum(a == b for a, b in pairs)} / {len(pairs)} |")
    lines += ["", "```", report["meta"]["command"], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
