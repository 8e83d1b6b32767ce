"""CLI: ``python -m sglang_reanchor.bench [run|cost|merge|round-ops] ...``.

``run`` (the default) compares methods on datasets and writes ``results.md``,
``results.json`` and ``acceptance_histogram.png`` into ``--out``::

    python -m sglang_reanchor.bench --datasets gsm8k humaneval mt-bench aime25 \\
        --methods target dflash reanchor --ablations --limit 10 --max-new-tokens 128 \\
        --diagnostic 3 --out results/bench

``cost`` measures the verify/draft cost curve on this machine, runs a traced
ReAnchor sweep on development prompts (disjoint from ``run``'s, via ``--skip``),
predicts tokens/s per (policy, offsets, node budget, depth cap) and writes ``cost_profile.json``
(load it with ``run --profile``), ``cost.md`` and ``cost_curve.png``::

    python -m sglang_reanchor.bench cost --out results/cost

``round-ops`` counts the round core's host syncs and torch ops per step (no model;
`sglang_reanchor.bench.round_ops`)::

    python -m sglang_reanchor.bench round-ops --out results/round_ops

``merge`` joins the ``results.json`` of runs split across processes (e.g. one per
dataset, same methods and settings) into one report::

    python -m sglang_reanchor.bench merge results/a/results.json results/b/results.json \
        --out results/bench
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from ..config import ATTACH_POLICIES, ReAnchorConfig
from ..precision import cpu_bf16_flags, parse_dtype
from ..runtime import keep_freed_memory
from . import cost as cost_mod
from .datasets import Sample, load_dataset, read_prompts
from .methods import MethodSpec, parse_methods
from .metrics import Record
from .report import write_report
from .runner import DEPTHS, BenchSettings, Runner

DEFAULT_DATASETS = ("gsm8k", "humaneval", "mt-bench", "aime25")
SWEEP_OFFSETS = ("1", "1/2", "1/2/3", "1/2/3/4", "1/2/3/4/5/6")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="HF model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", default=None, help="z-lab-format drafter folder (default: the shipped one)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    p.add_argument("--dtype", default="auto", help="precision of target and drafter: auto (bfloat16 on CUDA "
                   "and on CPUs with AMX / AVX-512 BF16, else float32), float32, bfloat16")
    p.add_argument("--datasets", nargs="*", default=None, help=f"default: {' '.join(DEFAULT_DATASETS)}")
    p.add_argument("--dataset-file", action="append", default=[], metavar="NAME=PATH",
                   help="read dataset NAME from a local JSONL (math500, mbpp, livecodebench, alpaca, ...)")
    p.add_argument("--prompts", action="append", default=[], metavar="FILE.jsonl",
                   help="extra prompts: lines with 'prompt', 'turns' or 'messages'")
    p.add_argument("--limit", type=int, default=None, help="samples per dataset")
    p.add_argument("--skip", type=int, default=0, help="skip the first K samples of each dataset")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sglang_reanchor.bench", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="compare methods (default)")
    _common(run)
    run.add_argument("--extra-drafter", action="append", default=[], metavar="NAME=DIR",
                     help="a further drafter folder, used by methods with drafter=NAME (e.g. dflash:drafter=NAME)")
    run.add_argument("--methods", nargs="+", default=["target", "dflash", "reanchor"],
                     help="specs METHOD[:KEY=VAL,...], e.g. reanchor:policy=offset or reanchor:offsets=1/2")
    run.add_argument("--ablations", action="store_true", help="add the Table 4/6/7 variants")
    run.add_argument("--diagnostic", type=int, default=0, help="samples per dataset for the Table 8 pass")
    run.add_argument("--no-trace", action="store_true", help="skip per-round analysis (Tables 1, 5)")
    run.add_argument("--profile", type=Path, default=None,
                     help="cost_profile.json: its chosen defaults become the base config, and "
                     "reanchor:node_budget=auto methods choose budgets with its cost curve")
    run.add_argument("--offsets", default=None, help="base ReAnchor offsets, e.g. 1/2/3")
    run.add_argument("--node-budget", type=int, default=None)
    c = sub.add_parser("cost", help="cost curve and defaults")
    _common(c)
    c.add_argument("--prefix", type=int, default=256, help="committed tokens before measured forwards")
    c.add_argument("--repeats", type=int, default=5)
    c.add_argument("--sweep-offsets", nargs="+", default=list(SWEEP_OFFSETS))
    c.add_argument("--sweep-budget", type=int, default=128)
    c.add_argument("--sweep-policies", nargs="+", default=["earliest"], choices=ATTACH_POLICIES,
                   help="attachment policies swept (each with every --sweep-offsets)")
    c.add_argument("--pack-linears", action="store_true",
                   help="measure with float32 CPU linears packed for oneDNN (`engine.packed_linear`), as a server "
                   "with $SGLANG_REANCHOR_PACK_LINEARS=1 runs them")
    c.add_argument("--sweep-records", type=Path, default=None,
                   help="reuse the records of an earlier sweep (its sweep/results.json) instead of running one")
    m = sub.add_parser("merge", help="one report from the results.json of split runs")
    m.add_argument("inputs", nargs="+", type=Path, help="results.json files (same methods and settings)")
    m.add_argument("--out", type=Path, required=True)
    if not argv or argv[0] not in ("run", "cost", "merge", "-h", "--help"):
        argv = ["run", *argv]
    return parser.parse_args(argv)


def load_samples(args: argparse.Namespace) -> list[Sample]:
    files = {}
    for item in args.dataset_file:
        name, eq, path = item.partition("=")
        if not eq:
            raise SystemExit(f"--dataset-file takes NAME=PATH, got {item!r}")
        files[name] = path
    names = list(args.datasets) if args.datasets is not None else ([] if args.prompts else list(DEFAULT_DATASETS))
    names += [n for n in files if n not in names]
    samples: list[Sample] = []
    for name in names:
        rows = load_dataset(name, files.get(name))
        samples += rows[args.skip:][: args.limit]
    for path in args.prompts:
        samples += read_prompts(path)[: args.limit]
    if not samples:
        raise SystemExit("no prompts: pass --datasets, --dataset-file or --prompts")
    return samples


def load_pair(args: argparse.Namespace):
    """(target, drafter, tokenizer, drafter description)."""
    from ..drafter import DFlashDrafter
    from ..hub import default_drafter, load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target, device=args.device, dtype=parse_dtype(args.dtype, args.device))
    if args.drafter is None:
        drafter = default_drafter(target, device=target.device, dtype=target.dtype)
    else:
        drafter = DFlashDrafter.from_pretrained(args.drafter, device=target.device, dtype=target.dtype)
        drafter.provenance = f"loaded from {args.drafter}"
    return target, drafter, tokenizer, getattr(drafter, "provenance", "")


def load_extra_drafters(items: list[str], target: torch.nn.Module) -> dict:
    """``NAME=DIR`` items (``--extra-drafter``) -> drafters by name, in the target's device and dtype."""
    from ..drafter import DFlashDrafter

    out = {}
    for item in items:
        name, eq, path = item.partition("=")
        if not eq or not name or not path:
            raise SystemExit(f"--extra-drafter {item!r}: expected NAME=DIR")
        if name in out:
            raise SystemExit(f"--extra-drafter: the name {name!r} is given twice")
        out[name] = DFlashDrafter.from_pretrained(path, device=target.device, dtype=target.dtype)
    return out


def _codecs(tokenizer):
    def encode(messages: list[dict[str, str]]) -> list[int]:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        return list(out["input_ids"])

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    return encode, decode


def _settings(args: argparse.Namespace, diagnostic: int = 0, trace: bool = True) -> BenchSettings:
    return BenchSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed, trace=trace, diagnostic=diagnostic)


def _meta(args: argparse.Namespace, argv: list[str], provenance: str, config: ReAnchorConfig) -> dict:
    return {"command": "python -m sglang_reanchor.bench " + shlex.join(argv), "drafter": provenance,
            "target": args.target or "SmolLM2-135M-Instruct (default)", "config": repr(config),
            "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed,
            "torch_threads": torch.get_num_threads(), "machine": platform.platform(),
            "cpu_bf16_flags": list(cpu_bf16_flags()), "dtype_flag": args.dtype,
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


def cmd_run(args: argparse.Namespace, argv: list[str]) -> int:
    specs = parse_methods(args.methods, ablations=args.ablations)
    base = cost_mod.profile_config(args.profile) if args.profile else ReAnchorConfig()
    if args.offsets:
        base = base.replace(offsets=tuple(int(d) for d in args.offsets.split("/")))
    if args.node_budget:
        base = base.replace(node_budget=args.node_budget)
    samples = load_samples(args)
    target, drafter, tokenizer, provenance = load_pair(args)
    encode, decode = _codecs(tokenizer)
    profile = cost_mod.CostProfile.load(args.profile) if args.profile else None
    extra = load_extra_drafters(args.extra_drafter, target)
    runner = Runner(target, drafter, specs, base, encode, decode, _settings(args, args.diagnostic, not args.no_trace),
                    profile=profile, drafters=extra)
    print(f"drafter: {provenance}\nbase config: {base}\n{len(samples)} samples x {len(specs)} methods", flush=True)
    records = runner.run(samples)
    meta = _meta(args, argv, provenance, base)
    if extra:
        meta["extra_drafters"] = dict(item.split("=", 1) for item in args.extra_drafter)
    meta["description"] = (f"Target {meta['target']}; drafter: {provenance}. T={args.temperature}, "
                           f"max_new_tokens={args.max_new_tokens}, base config {base}. "
                           "tau = accepted drafts + 1 per round, mean per response then over responses; "
                           "speedup = mean TPOT(target) / mean TPOT(method), end to end, same run.")
    paths = write_report(args.out, records, meta)
    print(paths["markdown"].read_text())
    return 0


def cmd_cost(args: argparse.Namespace, argv: list[str]) -> int:
    target, drafter, tokenizer, provenance = load_pair(args)
    if args.pack_linears:
        from ..engine.packed_linear import pack_linears

        if not pack_linears(target) + pack_linears(drafter):
            raise SystemExit("--pack-linears: nothing to pack (float32 CPU linears and oneDNN's ops are needed)")
    print(f"drafter: {provenance}; measuring forwards at prefix {args.prefix} ...", flush=True)
    profile = cost_mod.measure_profile(target, drafter, prefix=args.prefix, repeats=args.repeats, depths=DEPTHS)
    profile.packed_linears = bool(args.pack_linears)
    if args.sweep_records is not None:
        records = [Record(**r) for r in json.loads(args.sweep_records.read_text())["records"]]
    else:
        specs = [MethodSpec.parse("dflash")] + [
            MethodSpec.parse(f"reanchor:{'' if p == 'earliest' else f'policy={p},'}offsets={o},"
                             f"node_budget={args.sweep_budget}")
            for p in args.sweep_policies for o in args.sweep_offsets]
        encode, decode = _codecs(tokenizer)
        runner = Runner(target, drafter, specs, ReAnchorConfig(), encode, decode, _settings(args))
        records = runner.run(load_samples(args), desc="sweep")
    profile.overhead_s = cost_mod.fit_overhead(profile, records)
    curve = cost_mod.budget_curve(profile, records)
    profile.defaults = cost_mod.choose_defaults(curve)
    args.out.mkdir(parents=True, exist_ok=True)
    profile.save(args.out / "cost_profile.json")
    cost_mod.plot_curve(profile, curve, args.out / "cost_curve.png")
    meta = _meta(args, argv, provenance, ReAnchorConfig())
    if args.sweep_records is None:
        write_report(args.out / "sweep", records, meta | {"description": "Development sweep for the cost model."})
    (args.out / "cost.md").write_text(cost_mod.cost_markdown(profile, curve, meta["command"]))
    print((args.out / "cost.md").read_text())
    return 0


def cmd_merge(args: argparse.Namespace, argv: list[str]) -> int:
    runs = [json.loads(path.read_text()) for path in args.inputs]
    methods = [sorted({r["method"] for r in run["records"]} - {"diagnostic"}) for run in runs]
    if any(m != methods[0] for m in methods):
        raise SystemExit(f"merge: the runs compare different methods: {methods}")
    records = [Record(**r) for run in runs for r in run["records"]]
    metas = [run["meta"] for run in runs]
    meta = {**metas[0], "command": "\n".join(m.get("command", "") for m in metas)
            + "\npython -m sglang_reanchor.bench " + shlex.join(argv),
            "description": metas[0].get("description", "") + f" Merged from {len(runs)} runs (commands below)."}
    paths = write_report(args.out, records, meta)
    print(paths["markdown"].read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["round-ops"]:  # no model: its own small CLI
        from . import round_ops

        return round_ops.main(argv[1:])
    args = parse_args(argv)
    keep_freed_memory()  # the same allocator settings for every method (sglang_reanchor.runtime)
    commands = {"cost": cmd_cost, "merge": cmd_merge}
    return commands.get(args.command, cmd_run)(args, argv)


if __name__ == "__main__":
    sys.exit(main())
