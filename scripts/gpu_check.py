"""One GPU check that fits the GPU machine this project can get (one H200, no network).

    PYTHONPATH=. python scripts/gpu_check.py OUT_DIR                 # < 8 min on one H200
    PYTHONPATH=. python scripts/gpu_check.py OUT_DIR --device cpu --smoke   # tiny CPU run (~20 s)

Needs only torch, triton, transformers, numpy, safetensors and this repository: no
SGLang, no FlashInfer, no model weights, nothing downloaded. Writes
``OUT_DIR/gpu_check.json`` (every number) and ``OUT_DIR/gpu_check.md`` (the tables),
rewritten after each section so a run cut short still leaves what it measured.

Sections:

(a) **attention**: the Triton tree-attention kernel against the torch reference at
    realistic sizes (batch 1-64, prefix up to 32k, trees up to 128 nodes), with median
    kernel times; the cases and the check are those of ``scripts/gpu_check_attention.py``.
(b) **engine**, per random-weight model of a real shape (Qwen3-4B and Qwen3-8B targets in
    bf16, a z-lab-shaped drafter: 5 layers, block 16, ``target_layer_ids`` by z-lab's
    rule): verify time against tree nodes at batch 1, 4, 16, 32 (one batched target
    forward under a tree mask after a prefix), plain one-token decode time, drafter time
    against blocks ``1 + |D|``, one engine round's overhead beyond the two forwards, and
    losslessness: ``dflash`` and ``reanchor`` tokens equal Hugging Face greedy (float32).
(c) **projection**: tokens/s of target, DFlash and ReAnchor at each batch size, computed
    from (b)'s GPU costs and the tau-against-budget curves traced on the CPU's real pair
    (``--inputs``, default ``scripts/data/gpu_projection_inputs.json``, made by
    ``scripts/gpu_projection_inputs.py`` from two archived runs).
    It is a projection, not a measurement, and says so in its output.
(d) **FlashInfer**: skipped (its wheel does not fit one 64 MiB transfer to the machine).

``--time-budget`` (default 400 s, model construction included) stops sections early;
whatever did not run is listed as skipped. Exit status: 0 when everything that ran
passed, 1 when a kernel disagrees with the reference or a method's tokens differ from
greedy, 2 without CUDA (use ``--device cpu --smoke``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "scripts"))  # gpu_check_attention, imported in `attention_section`

import torch  # noqa: E402

DEFAULT_INPUTS = "scripts/data/gpu_projection_inputs.json"
FLASHINFER_NOTE = ("skipped: the flashinfer-python wheel (62 MB) and this repository (~18 MB) do not fit "
                   "one 64 MiB transfer to the GPU machine; run scripts/gpu_check_attention.py where "
                   "FlashInfer is installed")
PROJECTION_NOTE = ("PROJECTION, not a measurement: tokens/s = batch * tau / (verify + draft + overhead), "
                   "with verify, draft and overhead measured on this device with random-weight models of "
                   "the named shapes, and tau against node budget traced on CPU runs of SmolLM2-135M-Instruct "
                   "+ the shipped DFlash drafter (read from {inputs}). Random weights accept nothing, so "
                   "no tau here comes from this device.")

# The paper's Table 2, T = 0 (ReAnchor, Lee et al. 2026): tau / end-to-end speedup over the
# eight benchmarks (GSM8K, MATH, AIME25, HumanEval, MBPP, LiveCodeBench, MT-Bench, Alpaca).
PAPER_TABLE2 = {
    "qwen3-4b": {
        "dflash": ([6.24, 7.37, 6.36, 6.51, 5.81, 5.87, 3.46, 2.89],
                   [4.19, 5.10, 4.35, 4.39, 4.13, 4.19, 2.44, 2.01]),
        "reanchor": ([7.51, 8.45, 7.20, 7.50, 6.78, 6.84, 3.89, 3.17],
                     [5.03, 5.78, 4.90, 5.00, 4.78, 4.76, 2.68, 2.17]),
    },
    "qwen3-8b": {
        "dflash": ([6.34, 7.28, 6.38, 6.49, 5.71, 5.94, 3.42, 2.87],
                   [4.39, 5.05, 4.41, 4.43, 4.06, 4.10, 2.40, 1.99]),
        "reanchor": ([7.45, 8.31, 7.11, 7.52, 6.68, 7.24, 3.82, 3.16],
                     [5.03, 5.67, 4.72, 5.05, 4.69, 4.83, 2.57, 2.14]),
    },
}


@dataclass(frozen=True)
class Shape:
    """A Qwen3 target shape (HF ``Qwen3Config`` names) and the drafter built for it."""

    name: str
    paper_key: str  # row of PAPER_TABLE2 whose tau the what-if projection uses
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    mask_token_id: int  # z-lab drafters' MASK id (151669 for Qwen3)
    eos_token_id: int
    drafter_layers: int = 5
    block_size: int = 16


# Values of the released Qwen/Qwen3-4B and Qwen/Qwen3-8B config.json files.
QWEN3_4B = Shape("qwen3-4b", "qwen3-4b", 2560, 36, 32, 8, 128, 9728, 151936, True, 151669, 151645)
QWEN3_8B = Shape("qwen3-8b", "qwen3-8b", 4096, 36, 32, 8, 128, 12288, 151936, False, 151669, 151645)
# Smoke-mode stand-ins: same structure (GQA, qk-norm, tied / untied head), tiny sizes.
TINY_4B = Shape("tiny-4b-like", "qwen3-4b", 64, 6, 4, 2, 16, 128, 256, True, 255, 2)
TINY_8B = Shape("tiny-8b-like", "qwen3-8b", 96, 6, 4, 2, 24, 192, 256, False, 255, 2)
SHAPES = {"4b": QWEN3_4B, "8b": QWEN3_8B}


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="folder for gpu_check.json and gpu_check.md (created)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--smoke", action="store_true", help="tiny shapes and grids (for --device cpu)")
    p.add_argument("--time-budget", type=float, default=400.0, help="seconds for everything (default 400)")
    p.add_argument("--models", default="4b,8b", help="comma list of 4b, 8b (default both)")
    p.add_argument("--batch-sizes", type=int_list, default=[1, 4, 16, 32])
    p.add_argument("--nodes", type=int_list, default=[1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128])
    p.add_argument("--blocks", type=int_list, default=[1, 2, 3, 4], help="drafter blocks 1 + |D|")
    p.add_argument("--prefix", type=int, default=1024, help="committed tokens before timed forwards")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens per lossless / overhead generation")
    p.add_argument("--prompts", type=int, default=3, help="prompts for the lossless check")
    p.add_argument("--attn-batch-sizes", type=int_list, default=[1, 8, 64])
    p.add_argument("--attn-prefix-lens", type=int_list, default=[1024, 32768])
    p.add_argument("--attn-tree-sizes", type=int_list, default=[16, 64, 128])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--inputs", type=Path, default=Path(DEFAULT_INPUTS), help="tau curves (see the docstring)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-attention", action="store_true")
    args = p.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    if not names or any(m not in SHAPES for m in names):
        p.error(f"--models takes a comma list of {', '.join(SHAPES)}, got {args.models!r}")
    if args.smoke:
        args.shapes = [TINY_4B if m == "4b" else TINY_8B for m in names]
        args.batch_sizes, args.nodes, args.blocks = [1, 2], [1, 8, 32, 64], [1, 2, 4]
        args.prefix, args.new_tokens, args.prompts = 24, 12, 2
        args.attn_batch_sizes, args.attn_prefix_lens, args.attn_tree_sizes = [1, 2], [0, 7], [3]
        args.warmup, args.iters = 0, 1
        args.attn_heads = (4, 2, 16)
    else:
        args.shapes = [SHAPES[m] for m in names]
        args.attn_heads = (32, 8, 128)  # Qwen3-4B/8B: 32 query heads, 8 KV heads, head_dim 128
    if 1 not in args.batch_sizes:
        p.error("--batch-sizes must include 1 (the engine's round overhead is measured at batch 1)")
    if min(args.batch_sizes + args.nodes + args.blocks) < 1 or args.prefix < 1:
        p.error("batch sizes, node counts, block counts and --prefix must be >= 1")
    args.inputs = args.inputs if args.inputs.is_absolute() else ROOT / args.inputs
    if not args.inputs.exists():
        p.error(f"--inputs {args.inputs} is missing: make it with python scripts/gpu_projection_inputs.py "
                "(its docstring has the command behind the default)")
    return args


class Clock:
    """The run's time budget, shared out to sections by fractions of the whole."""

    def __init__(self, total: float) -> None:
        self.start, self.total = time.monotonic(), total

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def past(self, fraction: float) -> bool:
        return self.elapsed() > fraction * self.total


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], args: argparse.Namespace) -> float:
    from gpu_check_attention import median_ms as timed  # CUDA events on GPU, wall clock on CPU

    return timed(fn, args.warmup, args.iters, args.device)


# ---- (a) attention ---------------------------------------------------------------------


def attention_section(args: argparse.Namespace, clock: Clock, until: float) -> dict:
    """Triton vs the float32 torch reference on ``scripts/gpu_check_attention.py``'s cases."""
    import gpu_check_attention as gca

    q_heads, kv_heads, head_dim = args.attn_heads
    cargs = gca.parse_args([
        "--device", args.device, "--no-flashinfer", "--dtype", "bfloat16" if args.device == "cuda" else "float32",
        "--num-q-heads", str(q_heads), "--num-kv-heads", str(kv_heads), "--head-dim", str(head_dim),
        "--warmup", str(max(args.warmup, 1 if args.device == "cuda" else 0)), "--iters", str(args.iters * 2),
    ])
    gen = torch.Generator().manual_seed(args.seed)
    rows, skipped = [], []
    for bs in args.attn_batch_sizes:
        for prefix in args.attn_prefix_lens:
            for nodes in args.attn_tree_sizes:
                key = {"batch": bs, "prefix": prefix, "nodes": nodes}
                if clock.past(until):
                    skipped.append(f"attention bs={bs} prefix={prefix} nodes={nodes} (time budget)")
                    continue
                try:
                    raw = gca.check_one(gca.make_case(bs, prefix, nodes, cargs, gen), cargs, None)
                    err = raw.get("triton_err", "ERROR")
                    rows.append(key | {
                        "ref_ms": float(raw["ref_ms"]),
                        "triton_ms": float(raw["triton_ms"]) if "triton_ms" in raw else None,
                        "triton_max_abs_err": float(err.split()[0]) if not err.startswith("ERROR") else None,
                        "ok": raw["status"] == "ok",
                    })
                except Exception as exc:  # one failing size must not hide the others
                    rows.append(key | {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:200]})
                if args.device == "cuda":
                    torch.cuda.empty_cache()
                print(f"attention {rows[-1]}", flush=True)
    return {"dtype": cargs.dtype, "heads": {"q": q_heads, "kv": kv_heads, "head_dim": head_dim},
            "tolerance": {"atol": cargs.atol, "rtol": cargs.rtol}, "rows": rows, "skipped": skipped,
            "ok": all(r["ok"] for r in rows)}


# ---- (b) engine on random-weight models of real shapes ------------------------------------


def build_models(shape: Shape, device: str, dtype: torch.dtype, seed: int):
    """Random ``Qwen3ForCausalLM`` and z-lab-shaped `DFlashDrafter`, created on ``device`` in ``dtype``.

    Parameters are allocated and initialised (HF init: N(0, 0.02), unit norms) directly on
    the device in the target dtype, so an 8B shape takes seconds, not a CPU init and a copy.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sglang_reanchor.drafter import DFlashConfig, DFlashDrafter

    config = Qwen3Config(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads, head_dim=shape.head_dim,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
        tie_word_embeddings=shape.tie_word_embeddings, eos_token_id=shape.eos_token_id,
        pad_token_id=shape.eos_token_id, bos_token_id=None,
    )
    dconfig = DFlashConfig.for_target(config, num_layers=shape.drafter_layers, block_size=shape.block_size,
                                      mask_token_id=shape.mask_token_id)
    previous = torch.get_default_dtype()
    torch.manual_seed(seed)
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            target = Qwen3ForCausalLM(config)
            drafter = DFlashDrafter(dconfig)
    finally:
        torch.set_default_dtype(previous)
    target.config._attn_implementation = "sdpa"
    drafter.rotary_emb.inv_freq = drafter.rotary_emb.compute_inv_freq(torch.device(device))  # float32 RoPE
    return target.to(dtype).eval(), drafter.to(dtype).eval()


def random_tree(nodes: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ancestor mask [n, n] bool, depth [n] long)`` of a random tree (half chain, half branches)."""
    from attention import ancestor_mask, tree_depths
    from gpu_check_attention import random_parents

    parents = random_parents(nodes, gen)
    return ancestor_mask(parents), tree_depths([parents])


class Bench:
    """Timed target and drafter forwards of one model pair at one batch size after ``prefix`` tokens."""

    def __init__(self, tm, drafter, bs: int, prefix: int, args: argparse.Namespace, gen: torch.Generator) -> None:
        from sglang_reanchor.drafter import DraftContextCache

        self.tm, self.drafter, self.bs, self.prefix, self.args, self.gen = tm, drafter, bs, prefix, args, gen
        self.dev = tm.device
        self.vocab = tm.config.vocab_size
        self.cache = tm.new_cache()
        prompt = torch.randint(self.vocab, (bs, prefix), generator=gen)
        out = tm.forward(prompt, torch.arange(prefix).expand(bs, -1), self.cache, features=True, last_only=True)
        self.features = out.features  # [bs, prefix, K*H]
        self.dcache = DraftContextCache()
        positions = torch.arange(prefix, device=self.dev).expand(bs, -1)
        self.dcache.append(drafter.project_context(self.features, positions))
        self.empty = torch.zeros(0, dtype=torch.long, device=self.dev)

    def decode_ms(self) -> float:
        """Plain decoding: one new token per sequence, no tree mask, no features."""
        ids = torch.randint(self.vocab, (self.bs, 1), generator=self.gen)
        pos = torch.full((self.bs, 1), self.prefix)

        def step() -> None:
            self.tm.forward(ids, pos, self.cache, features=False)
            self.tm.keep_tokens(self.cache, self.prefix, self.empty)

        return median_ms(step, self.args)

    def verify_ms(self, nodes: int) -> float:
        """The engine's verify forward (tree mask, logits and drafter features of every node),
        batched: ``bs`` sequences of ``nodes`` each under one shared random tree."""
        mask, depth = random_tree(nodes, self.gen)
        ids = torch.randint(self.vocab, (self.bs, nodes), generator=self.gen)
        pos = (self.prefix + depth).expand(self.bs, -1)

        def step() -> None:
            self.tm.forward(ids, pos, self.cache, mask)  # the [n, n] mask broadcasts over the batch
            self.tm.keep_tokens(self.cache, self.prefix, self.empty)

        return median_ms(step, self.args)

    def draft_ms(self, blocks: int) -> float:
        """One drafter forward over ``blocks`` = 1 + |D| blocks per sequence (D = 1..blocks-1)."""
        from sglang_reanchor.drafter import draft_blocks

        offs = list(range(1, blocks))
        dev, bs, s = self.dev, self.bs, self.prefix
        anchors = torch.randint(self.vocab, (bs, blocks), generator=self.gen).to(dev)
        anchor_pos = torch.tensor([[s] + [s + d for d in offs]], device=dev).expand(bs, -1)
        visible = torch.tensor([[0] + offs], device=dev).expand(bs, -1)
        extra = self.features[:, s - max(offs):] if offs else None

        def step() -> None:
            draft_blocks(self.drafter, self.dcache, anchors=anchors, anchor_positions=anchor_pos,
                         extra_features=extra, extra_visible=visible,
                         embed_tokens=self.tm.embed_tokens, lm_head=self.tm.lm_head)

        return median_ms(step, self.args)


def round_overhead(target, drafter, costs: dict, args: argparse.Namespace, gen: torch.Generator) -> dict:
    """Per-round engine time beyond the two timed forwards, at batch 1, for DFlash and ReAnchor.

    Random weights reject at the first draft every round, so every ReAnchor round after the
    first drafts all ``1 + |D|`` blocks; the drafter cost is taken at that many blocks.
    """
    from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator
    from sglang_reanchor.budget import interpolate

    config = ReAnchorConfig()
    engine = SpeculativeGenerator(target, drafter, config)
    prompt = torch.randint(target.config.vocab_size, (1, args.prefix), generator=gen)
    engine.generate(prompt, 4, method="reanchor")  # warm the kernels of every shape used below
    out = {}
    verify = {int(k): v for k, v in costs["verify_ms"]["1"].items()}
    draft = {int(k): v for k, v in costs["draft_ms"]["1"].items()}
    for method in ("target", "dflash", "reanchor"):
        res = engine.generate(prompt, args.new_tokens, method=method)
        steps = len(res.acceptance_lengths) if method != "target" else len(res.tokens) - 1
        per_step = 1e3 * res.decode_seconds / max(steps, 1)
        row = {"rounds": steps, "ms_per_round": per_step}
        if method != "target":
            nodes = statistics.mean(res.tree_sizes)
            blocks = 1 if method == "dflash" else 1 + len(config.offsets)
            modelled = interpolate(verify, nodes) + interpolate(draft, blocks)
            row |= {"mean_nodes": nodes, "blocks": blocks, "forwards_ms": modelled,
                    "overhead_ms": per_step - modelled, "mean_tau": res.mean_acceptance_length}
        out[method] = row
    return out


def hf_greedy(model, prompt: torch.Tensor, max_new: int) -> list[int]:
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new,
                         do_sample=False, pad_token_id=model.config.pad_token_id)
    return out[0, prompt.shape[1]:].tolist()


def top2_gap(model, prompt: torch.Tensor, tokens: list[int]) -> float:
    """Target logit gap between its top two tokens after ``prompt + tokens`` (a near tie explains a flip)."""
    ids = torch.cat([prompt, torch.tensor([tokens], dtype=torch.long, device=prompt.device)], dim=1)
    top = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


def lossless(target, drafter, args: argparse.Namespace, gen: torch.Generator) -> dict:
    """``dflash`` and ``reanchor`` tokens against HF greedy, in float32 (see docs/gpu.md: bfloat16
    kernels round a 1-token and a 16-node forward differently, so exact equality is checked in float32)."""
    from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator

    target.float()
    drafter.float()
    engine = SpeculativeGenerator(target, drafter, ReAnchorConfig())
    rows = []
    lengths = [max(1, args.prefix // (i + 1) + 5 * i) for i in range(args.prompts)]
    for n in lengths:
        prompt = torch.randint(target.config.vocab_size, (1, n), generator=gen).to(target.device)
        expected = hf_greedy(target, prompt, args.new_tokens)
        row: dict = {"prompt_tokens": n, "greedy_tokens": len(expected)}
        for method in ("dflash", "reanchor"):
            res = engine.generate(prompt, args.new_tokens, method=method)
            same = res.tokens == expected
            row[method] = same
            row[f"{method}_rounds"] = len(res.acceptance_lengths)
            if not same:
                i = next((j for j, (a, b) in enumerate(zip(res.tokens, expected)) if a != b),
                         min(len(res.tokens), len(expected)))
                row[f"{method}_first_difference"] = i
                row[f"{method}_top2_gap_there"] = top2_gap(target, prompt, expected[:i])
        rows.append(row)
    return {"dtype": "float32", "new_tokens": args.new_tokens, "prompts": rows,
            "dflash": all(r["dflash"] for r in rows), "reanchor": all(r["reanchor"] for r in rows)}


@torch.inference_mode()
def model_section(shape: Shape, args: argparse.Namespace, clock: Clock, until: float) -> dict:
    """Section (b) for one shape; steps past ``until`` (a fraction of the budget) are skipped."""
    from sglang_reanchor.engine import TargetModel

    dev, dtype = args.device, args.dtype
    result: dict = {"shape": asdict(shape), "dtype": str(dtype).removeprefix("torch."), "prefix": args.prefix,
                    "verify_ms": {}, "decode_ms": {}, "draft_ms": {}, "skipped": [], "errors": []}
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.perf_counter()
    target, drafter = build_models(shape, dev, dtype, args.seed)
    sync(dev)
    result["build_s"] = time.perf_counter() - t0
    result["target_parameters"] = sum(p.numel() for p in target.parameters())
    result["drafter_parameters"] = sum(p.numel() for p in drafter.parameters())
    result["target_layer_ids"] = list(drafter.target_layer_ids)
    print(f"{shape.name}: built in {result['build_s']:.1f} s ({result['target_parameters'] / 1e9:.2f} B target "
          f"parameters, drafter layers {drafter.config.num_hidden_layers}, ids {result['target_layer_ids']})",
          flush=True)
    tm = TargetModel(target, tuple(drafter.target_layer_ids))

    def grid(bs: int) -> None:
        bench = Bench(tm, drafter, bs, args.prefix, args, gen)
        result["decode_ms"][str(bs)] = bench.decode_ms()
        result["verify_ms"][str(bs)] = {}
        for n in args.nodes:
            result["verify_ms"][str(bs)][str(n)] = bench.verify_ms(n)
        result["draft_ms"][str(bs)] = {str(r): bench.draft_ms(r) for r in args.blocks}
        print(f"{shape.name} bs={bs}: decode {result['decode_ms'][str(bs)]:.2f} ms, verify "
              + ", ".join(f"{n}:{v:.2f}" for n, v in result["verify_ms"][str(bs)].items())
              + " ms, draft " + ", ".join(f"{r}:{v:.2f}" for r, v in result["draft_ms"][str(bs)].items()) + " ms",
              flush=True)
        del bench
        gc.collect()
        if dev == "cuda":
            torch.cuda.empty_cache()

    # batch 1 first, then the engine checks, then the larger batches: what matters most runs first
    grid(1)
    for name, step in (("overhead", lambda: round_overhead(target, drafter, result, args, gen)),
                       ("lossless", lambda: lossless(target, drafter, args, gen))):
        if clock.past(until):
            result["skipped"].append(f"{shape.name}: {name} (time budget)")
            continue
        try:
            result[name] = step()
            print(f"{shape.name} {name}: {json.dumps(result[name])[:400]}", flush=True)
        except Exception as exc:  # report it and keep the rest of the run
            result["errors"].append(f"{shape.name}: {name}: {type(exc).__name__}: {exc}"[:400])
    target.to(dtype)
    drafter.to(dtype)
    for bs in (b for b in args.batch_sizes if b != 1):
        if clock.past(until):
            result["skipped"].append(f"{shape.name}: batch {bs} timings (time budget)")
            continue
        try:
            grid(bs)
        except Exception as exc:  # e.g. out of memory at a large batch: the smaller ones still count
            for table in ("decode_ms", "verify_ms", "draft_ms"):
                result[table].pop(str(bs), None)
            result["errors"].append(f"{shape.name}: batch {bs} timings: {type(exc).__name__}: {exc}"[:400])
            gc.collect()
            if dev == "cuda":
                torch.cuda.empty_cache()
    del tm, target, drafter
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()
    return result


# ---- (c) projection ----------------------------------------------------------------------


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def projection(models: list[dict], inputs_path: Path) -> dict:
    """Projected tokens/s per model, batch size and method (see PROJECTION_NOTE)."""
    from sglang_reanchor.budget import interpolate

    inputs = json.loads(inputs_path.read_text())
    rel = os.path.relpath(inputs_path, ROOT)
    rows, paper_rows = [], []
    for m in models:
        name, over = m["shape"]["name"], m.get("overhead")
        if not over:
            continue
        oh = {k: max(0.0, over[k]["overhead_ms"]) for k in ("dflash", "reanchor")}
        for bs_key in m["verify_ms"]:
            bs = int(bs_key)
            verify = {int(k): v for k, v in m["verify_ms"][bs_key].items()}
            draft = {int(k): v for k, v in m["draft_ms"][bs_key].items()}
            base = 1e3 * bs / m["decode_ms"][bs_key]
            common = {"model": name, "batch": bs}
            rows.append(common | {"source": "-", "method": "target", "label": "target", "budget": 1, "tau": 1.0,
                                  "nodes": 1.0, "blocks": 0.0, "round_ms": m["decode_ms"][bs_key],
                                  "tokens_per_s": base, "speedup": 1.0})
            for c in inputs["curves"]:
                for p in c["points"]:
                    blocks = c["blocks_per_round"]
                    if not (min(verify) <= p["nodes"] <= max(verify) and min(draft) <= blocks <= max(draft)):
                        continue  # outside the measured sizes: no extrapolation
                    round_ms = (interpolate(verify, p["nodes"]) + interpolate(draft, c["blocks_per_round"])
                                + oh["dflash" if c["method"] == "dflash" else "reanchor"])
                    tps = 1e3 * bs * p["tau"] / round_ms
                    rows.append(common | {"source": c["source"], "method": c["method"], "label": c["label"],
                                          "budget": p["budget"], "tau": p["tau"], "nodes": p["nodes"],
                                          "blocks": c["blocks_per_round"], "round_ms": round_ms,
                                          "tokens_per_s": tps, "speedup": tps / base})
            paper = PAPER_TABLE2[m["shape"]["paper_key"]]
            for method, nodes, blocks in (("dflash", m["shape"]["block_size"], 1), ("reanchor", 48, 4)):
                if nodes > max(verify) or blocks > max(draft):
                    continue
                tau = _mean(paper[method][0])
                round_ms = interpolate(verify, nodes) + interpolate(draft, blocks) + oh[method]
                tps = 1e3 * bs * tau / round_ms
                paper_rows.append(common | {"method": method, "paper_tau": tau, "nodes": nodes, "blocks": blocks,
                                            "round_ms": round_ms, "tokens_per_s": tps, "speedup": tps / base,
                                            "paper_speedup": _mean(paper[method][1])})
    return {
        "note": PROJECTION_NOTE.format(inputs=rel),
        "inputs": rel, "inputs_made_by": inputs.get("made_by", ""), "pair": inputs.get("pair", ""),
        "sources": inputs.get("sources", {}),
        "assumptions": [
            "verify(bs, n) is one batched target forward of bs sequences with n tree nodes each after "
            "the measured prefix; draft(bs, r) one drafter forward over r blocks per sequence",
            "the per-round overhead (tree build, acceptance, cache compaction) is the reference engine's at "
            "batch 1, taken as once per batched round (a batching server does that work once per batch)",
            "tau and nodes per round at budget b come from the CPU traces (round-weighted means), "
            "fractional nodes and blocks interpolated piecewise linearly between measured sizes (points "
            "outside them are left out)",
            "paper_tau rows: the paper's Table 2 mean tau (T = 0, eight benchmarks) with DFlash verifying "
            "16 nodes and ReAnchor 48 nodes from 4 drafter blocks, against the paper's own speedups",
        ],
        "rows": rows,
        "paper_tau_rows": paper_rows,
    }


# ---- output ------------------------------------------------------------------------------


def _f(x: object, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt) if isinstance(x, float) else str(x)


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    lines = [f"# GPU check ({meta['device_name']}, {meta['date_utc']})", "",
             f"`{meta['command']}`; torch {meta['torch']}, triton {meta['triton']}, transformers "
             f"{meta['transformers']}; {meta['elapsed_s']:.0f} s of a {meta['time_budget_s']:.0f} s budget"
             + ("; **smoke mode (tiny shapes, CPU: times mean nothing)**" if meta["smoke"] else "") + ".", ""]
    att = doc.get("attention")
    if att:
        h = att["heads"]
        lines += ["## (a) Triton tree attention vs torch reference", "",
                  f"{att['dtype']}, {h['q']} query / {h['kv']} KV heads, head_dim {h['head_dim']}; "
                  f"times: median ms; tolerance atol {att['tolerance']['atol']}, rtol {att['tolerance']['rtol']}.", "",
                  "| batch | prefix | nodes | reference ms | triton ms | max abs err | ok |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['batch']} | {r['prefix']} | {r['nodes']} | {_f(r.get('ref_ms'))} | "
                  f"{_f(r.get('triton_ms'), '.3f')} "
                  f"| {_f(r.get('triton_max_abs_err'), '.1e')} | {'yes' if r['ok'] else 'NO ' + r.get('error', '')} |"
                  for r in att["rows"]]
        lines.append("")
    for m in doc.get("models", []):
        s = m["shape"]
        lines += [f"## (b) {s['name']}: random weights, {m['dtype']}, prefix {m['prefix']}", "",
                  f"Target: hidden {s['hidden_size']}, {s['num_hidden_layers']} layers, {s['num_attention_heads']}/"
                  f"{s['num_key_value_heads']} heads, head_dim {s['head_dim']}, intermediate {s['intermediate_size']}, "
                  f"vocab {s['vocab_size']}, tied head {s['tie_word_embeddings']} "
                  f"({m['target_parameters'] / 1e6:,.1f} M "
                  f"parameters); drafter {s['drafter_layers']} layers, block {s['block_size']}, target_layer_ids "
                  f"{m['target_layer_ids']}. Built on the device in {m['build_s']:.1f} s.", ""]
        bss = list(m["verify_ms"])
        if bss:
            lines += ["Verify ms (one batched target forward under a tree mask) by tree nodes; `decode` = one "
                      "plain token per sequence:", "",
                      "| nodes | " + " | ".join(f"batch {b}" for b in bss) + " |", "|---" * (len(bss) + 1) + "|",
                      "| decode | " + " | ".join(_f(m["decode_ms"][b]) for b in bss) + " |"]
            for n in m["verify_ms"][bss[0]]:
                lines.append(f"| {n} | " + " | ".join(_f(m["verify_ms"][b].get(n)) for b in bss) + " |")
            lines += ["", "Drafter ms by blocks (1 + |D|):", "",
                      "| blocks | " + " | ".join(f"batch {b}" for b in bss) + " |", "|---" * (len(bss) + 1) + "|"]
            for r in m["draft_ms"][bss[0]]:
                lines.append(f"| {r} | " + " | ".join(_f(m["draft_ms"][b].get(r)) for b in bss) + " |")
            lines.append("")
        if "overhead" in m:
            o = m["overhead"]
            lines += ["Engine at batch 1 (reference engine, one request): ms per round, the two forwards from the "
                      "tables above, and the rest (overhead):", "",
                      "| method | rounds | ms/round | forwards ms | overhead ms |", "|---|---|---|---|---|"]
            lines += [f"| {k} | {v['rounds']} | {_f(v['ms_per_round'])} | {_f(v.get('forwards_ms'))} | "
                      f"{_f(v.get('overhead_ms'))} |" for k, v in o.items()]
            lines.append("")
        if "lossless" in m:
            ll = m["lossless"]
            lines += [f"Lossless ({ll['dtype']}, {ll['new_tokens']} new tokens, {len(ll['prompts'])} random prompts): "
                      f"dflash == HF greedy: **{ll['dflash']}**, reanchor == HF greedy: **{ll['reanchor']}**.", ""]
        if m["skipped"]:
            lines += ["Skipped: " + "; ".join(m["skipped"]), ""]
    proj = doc.get("projection")
    if proj and proj["rows"]:
        lines += ["## (c) Projected tokens/s (a projection, not a measurement)", "", proj["note"], ""]
        lines += [f"- {a}" for a in proj["assumptions"]] + [""]
        lines += projection_summary(proj["rows"], proj.get("sources", {}))
        lines += ["", "With the paper's tau instead (Table 2, Qwen3-4B / Qwen3-8B, T = 0, mean of eight benchmarks), "
                  "on this device's measured costs:", "",
                  "| model | batch | method | paper tau | nodes | blocks | round ms | tokens/s | projected speedup "
                  "| paper speedup |", "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['batch']} | {r['method']} | {r['paper_tau']:.2f} | {r['nodes']} | "
                  f"{r['blocks']} | "
                  f"{r['round_ms']:.2f} | {r['tokens_per_s']:.0f} | {r['speedup']:.2f}x | {r['paper_speedup']:.2f}x |"
                  for r in proj["paper_tau_rows"]]
        lines.append("")
    lines += ["## (d) FlashInfer", "", doc["flashinfer"], ""]
    if doc["skipped"]:
        lines += ["## Skipped", ""] + [f"- {s}" for s in doc["skipped"]] + [""]
    errors = doc["errors"] + [e for m in doc.get("models", []) for e in m["errors"]]
    if errors:
        lines += ["## Errors", ""] + [f"- {e}" for e in errors] + [""]
    if not doc["checks_run"] and not errors:
        lines += ["**Result: nothing was checked** (everything skipped).", ""]
    else:
        lines += [f"**Result: {'PASS' if doc['ok'] else 'FAIL'}** ({doc['checks_run']} checks: attention within "
                  "tolerance, dflash / reanchor equal to greedy per model; skipped parts listed above).", ""]
    return "\n".join(lines)


def projection_summary(rows: list[dict], sources: dict[str, dict]) -> list[str]:
    """One markdown row per (model, batch, tau source): target, DFlash, ReAnchor with the library
    defaults (D = {1,2,3}, earliest, budget 48) and the best ReAnchor (spec and budget) of that source;
    every (spec, budget) point is in the JSON. ``sources``: the inputs' run NAME -> {path, ...}."""

    def cell(r: dict | None, with_spec: bool = False) -> str:
        if r is None:
            return "-"
        spec = f" ({r['label']} @ {r['budget']})" if with_spec else ""
        return f"{r['tokens_per_s']:.0f} / {r['speedup']:.2f}x, tau {r['tau']:.2f}{spec}"

    named = ", ".join(f"`{name}` = {src.get('path', '?')}" for name, src in sources.items())
    out = ["Summary (tokens/s / speedup over the target at the same batch, tau; full (spec, budget) grid in the "
           f"JSON). Tau sources: {named or 'none named'}.", "",
           "| model | batch | tau source | target tok/s | DFlash | ReAnchor defaults (D={1,2,3}, budget 48) "
           "| best ReAnchor (spec @ budget) |", "|---|---|---|---|---|---|---|"]
    target = {(r["model"], r["batch"]): r for r in rows if r["method"] == "target"}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["method"] != "target":
            groups.setdefault((r["model"], r["batch"], r["source"]), []).append(r)
    for (model, bs, source), rs in groups.items():
        dflash = next((r for r in rs if r["method"] == "dflash"), None)
        ra = [r for r in rs if r["method"] == "reanchor"]
        default = next((r for r in ra if r["budget"] == 48 and "policy=" not in r["label"]
                        and ("offsets=" not in r["label"] or "offsets=1/2/3," in r["label"])), None)
        best = max(ra, key=lambda r: r["tokens_per_s"], default=None)
        out.append(f"| {model} | {bs} | {source} | {target[(model, bs)]['tokens_per_s']:.0f} | "
                   f"{cell(dflash)} | {cell(default)} | {cell(best, True)} |")
    return out


def write(doc: dict, out: Path, clock: Clock) -> None:
    doc["meta"]["elapsed_s"] = clock.elapsed()
    skipped = list(doc.get("attention", {}).get("skipped", []))
    for m in doc["models"]:
        skipped += m["skipped"]
    doc["skipped"] = doc["pending"] + skipped
    oks = [doc["attention"]["ok"]] if doc.get("attention", {}).get("rows") else []
    oks += [m["lossless"][k] for m in doc["models"] if "lossless" in m for k in ("dflash", "reanchor")]
    errors = list(doc["errors"]) + [e for m in doc["models"] for e in m["errors"]]
    doc["ok"] = all(oks) and not errors
    doc["checks_run"] = len(oks)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "gpu_check.md").write_text(markdown(doc))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before attention.triton_tree imports triton's jit
        args.dtype = torch.float32  # bfloat16 GEMMs are emulated on many CPUs
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device (use --device cpu --smoke for a CPU run)", file=sys.stderr)
            return 2
        args.dtype = torch.bfloat16
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 lossless check: plain float32 GEMMs
    import transformers
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    clock = Clock(args.time_budget)
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu ({platform.machine()}, smoke)"
    doc: dict = {
        "meta": {"command": "python scripts/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
                 "device_name": name,
                 "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "torch": torch.__version__,
                 "triton": triton_version, "transformers": transformers.__version__, "smoke": args.smoke,
                 "time_budget_s": args.time_budget, "seed": args.seed},
        "models": [], "errors": [], "flashinfer": FLASHINFER_NOTE,
        "pending": [f"{s.name}: whole section (time budget)" for s in args.shapes],
    }
    write(doc, args.out, clock)
    if args.no_attention:
        doc["pending"].insert(0, "attention (--no-attention)")
    elif triton_version == "not installed":
        doc["pending"].insert(0, "attention (triton not installed)")
    else:
        doc["attention"] = attention_section(args, clock, until=0.25)
        write(doc, args.out, clock)
    for i, shape in enumerate(args.shapes):
        until = 0.25 + 0.7 * (i + 1) / len(args.shapes)
        if clock.past(until - 0.7 / len(args.shapes) / 2):  # not even half its share left: skip the model
            continue
        doc["pending"].remove(f"{shape.name}: whole section (time budget)")
        try:
            doc["models"].append(model_section(shape, args, clock, until))
        except Exception as exc:  # a model that cannot even be built or timed at batch 1
            doc["errors"].append(f"{shape.name}: {type(exc).__name__}: {exc}"[:400])
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
        write(doc, args.out, clock)
    doc["projection"] = projection(doc["models"], args.inputs)
    write(doc, args.out, clock)
    print((args.out / "gpu_check.md").read_text())
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
