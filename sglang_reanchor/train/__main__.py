"""Train a DFlash drafter for a Hugging Face causal LM: ``python -m sglang_reanchor.train``.

Three commands (defaults train the shipped SmolLM2-135M-Instruct drafter)::

    # 1. prompts -> target responses + cached target features (resumable)
    python -m sglang_reanchor.train data --out /work/train_work/data \\
        --per-domain 200 --max-new-tokens 192 --batch-size 128
    # 2. train (resumable with --resume; validation tau every --eval-every steps)
    python -m sglang_reanchor.train fit --data /work/train_work/data \\
        --out /work/train_work/run --minutes 60
    # (more data: a further folder of prompts the first did not use, then --data A B)
    python -m sglang_reanchor.train data --out B --exclude A --per-domain 450 --num-val 0
    # 3. z-lab folder (config.json + model.safetensors, bfloat16)
    python -m sglang_reanchor.train export --ckpt /work/train_work/run/ckpt.pt \\
        --out sglang_reanchor/assets/smollm2-135m-dflash-b16

``--target DIR`` selects another HF causal LM (default: the SmolLM2 target of
`sglang_reanchor.hub`). ``data`` needs ``chatterbot-corpus`` (extra ``train``:
``pip install --no-deps chatterbot-corpus==1.3.3``) for its chat prompts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ..drafter import DFlashConfig, build_target_layer_ids
from ..hub import load_target
from ..precision import has_fast_cpu_bf16, parse_dtype
from ..runtime import keep_freed_memory

# SmolLM2's "<empty_output>" (id 16): a StarCoder notebook-format special token that the
# chat model never emits in a chat reply (it never appears in the training responses:
# `data` checks), so its embedding is free to mean "masked slot".
DEFAULT_MASK_TOKEN = "<empty_output>"


def _cmd_data(args: argparse.Namespace) -> None:
    from .data import build_dataset, prompt_texts, read_pack
    from .prompts import build_prompts, check_disjoint, eval_prompts, read_prompts

    torch.manual_seed(args.seed)
    model, tok = load_target(args.target, dtype=parse_dtype(args.dtype))
    layer_ids = _layer_ids(args.layers, model.config.num_hidden_layers, args.num_feature_layers)
    if args.prompts:  # a pool written by the `prompts` command
        prompts = read_prompts(args.prompts)
        check_disjoint(prompts, eval_prompts())
    else:
        prompts = build_prompts(args.seed, args.per_domain)  # raises if any overlaps an eval set
    if args.exclude:  # a further folder: only prompts none of the given folders used
        seen = set().union(*(prompt_texts(d) for d in args.exclude))
        prompts = [p for p in prompts if p.text not in seen]
    if args.max_prompts is not None:
        prompts = prompts[: args.max_prompts]
    if len(prompts) <= args.num_val:
        raise SystemExit(f"data: {len(prompts)} prompts left, need more than --num-val {args.num_val}")
    start = time.time()
    out = build_dataset(model, tok, prompts, args.out, layer_ids=layer_ids,
                        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                        num_val=args.num_val, max_prompt_tokens=args.max_prompt_tokens,
                        sort_window=args.sort_window,
                        known_responses=read_pack(args.pack) if args.pack else None,
                        extra_meta={"target": str(args.target or "default:SmolLM2-135M-Instruct"),
                                    "seed": args.seed, "per_domain": args.per_domain,
                                    "prompts_file": args.prompts})
    print(f"data written to {out} in {time.time() - start:.0f} s")


def _cmd_prompts(args: argparse.Namespace) -> None:
    from .prompts import POOL_SOURCES, build_pool, check_disjoint, eval_prompts, write_prompts

    counts = dict(POOL_SOURCES)
    for item in args.source:
        name, _, n = item.partition("=")
        counts[name] = int(n)
    counts = {k: v for k, v in counts.items() if v > 0}
    pool = build_pool(args.seed, counts)
    if args.self_instruct:
        from .self_instruct import self_instruct_prompts

        model, tok = load_target(args.target)
        seeds = [p.text for p in pool if p.source.startswith(("template:", "chatterbot"))]
        made = self_instruct_prompts(model, tok, seeds, args.self_instruct, seed=args.seed,
                                     batch_size=args.batch_size)
        check_disjoint(made, eval_prompts())
        pool = made if args.self_instruct_only else pool + made
    write_prompts(pool, args.out)
    print(f"{len(pool)} prompts written to {args.out}")


def _cmd_pack(args: argparse.Namespace) -> None:
    from .data import write_pack

    counts = write_pack(args.data, args.out)
    print(f"{counts['responses']} responses, {counts['tokens']} tokens packed into {args.out}")


def _cmd_curve(args: argparse.Namespace) -> None:
    from .trainer import training_curve

    curve = training_curve(args.log, args.out, args.title)
    print(f"{len(curve['points'])} validations -> {args.out}/curve.json, curve.png")


def _cmd_learning_curve(args: argparse.Namespace) -> None:
    from .learning_curve import learning_curve, read_point

    points = []
    for spec in args.point:
        try:
            name, tokens, labels, path = spec.split(":", 3)
            points.append(read_point(name, int(tokens), None if labels == "-" else int(labels), path))
        except (ValueError, OSError) as e:
            raise SystemExit(f"learning-curve: --point {spec!r}: {e} (expected NAME:RESPONSE_TOKENS:"
                             "LABELS_SEEN:RESULTS_JSON)") from e
    try:
        report = learning_curve(points, args.out, goal=args.goal, title=args.title)
    except ValueError as e:  # fewer than two distinct token counts
        raise SystemExit(f"learning-curve: {e}") from e
    fit, goal = report["fit"], report["goal"]
    print(f"{len(points)} points: tau = {fit['a']:.3f} + {fit['b']:.4f} ln(tokens) "
          f"(+{fit['tau_gain_per_doubling']:.3f} per doubling); tau {goal['tau']} on that line at "
          f"{goal['response_tokens_on_the_line']:.3g} response tokens "
          f"({goal['times_the_largest_point']:.3g}x the largest point) -> {args.out}/learning_curve.json, .png")


def _cmd_fit(args: argparse.Namespace) -> None:
    from .trainer import TrainSettings, fit

    model, tok = load_target(args.target, dtype=torch.float32)
    meta = json.loads((Path(args.data[0]) / "meta.json").read_text())
    mask_id = args.mask_token_id
    if mask_id is None:
        mask_id = tok.convert_tokens_to_ids(DEFAULT_MASK_TOKEN)
    config = DFlashConfig.for_target(
        model.config, num_layers=args.num_layers, block_size=args.block_size, mask_token_id=mask_id,
        target_layer_ids=meta["layer_ids"], intermediate_size=args.intermediate_size)
    settings = TrainSettings(
        lr=args.lr, warmup_steps=args.warmup, total_steps=args.steps, minutes=args.minutes,
        batch_seqs=args.batch_seqs, anchors_per_seq=args.anchors, gamma=args.gamma,
        sample_slots=not args.all_slots,
        eval_every=args.eval_every, save_every=args.save_every, seed=args.seed,
        val_max_new_tokens=args.val_tokens, val_prompts=args.val_prompts, init_from_target=not args.random_init,
        autocast=torch.cuda.is_available() or has_fast_cpu_bf16() if args.autocast == "auto"
        else args.autocast == "on")
    fit(model, tok, config, args.data, args.out, settings, resume=args.resume, init_from=args.init_from)


def _cmd_draft_vocab(args: argparse.Namespace) -> None:
    from ..drafter.draft_vocab import rank_tokens, save_draft_vocab
    from .data import load_sequences

    seqs = load_sequences(*args.data)
    starts = seqs.offsets[:-1] + seqs.prompt_lens  # responses only: the tokens the target writes
    in_response = torch.zeros(seqs.input_ids.shape[0] + 1, dtype=torch.long)
    in_response.index_add_(0, starts, torch.ones_like(starts))
    in_response.index_add_(0, seqs.offsets[1:], -torch.ones_like(starts))
    responses = seqs.input_ids[in_response.cumsum(0)[:-1].bool()]
    config = json.loads((Path(args.drafter) / "config.json").read_text())
    meta = json.loads((Path(args.data[0]) / "meta.json").read_text())
    ranking = rank_tokens(responses, int(config["vocab_size"]), always=tuple(meta.get("eos_ids", ())))
    path = save_draft_vocab(args.drafter, ranking)
    share = {k: round(float(torch.isin(responses, ranking[:k]).float().mean()), 5)
             for k in (2048, 4096, 8192, 16384) if k <= ranking.numel()}
    print(f"{ranking.numel()} tokens ranked from {responses.numel()} response tokens -> {path}; "
          f"share of response tokens covered by the top K: {share}")


def _cmd_export(args: argparse.Namespace) -> None:
    from .trainer import export

    path = export(args.ckpt, args.out, dtype=getattr(torch, args.dtype))
    print(f"exported to {path}")


def _layer_ids(spec: str | None, num_layers: int, k: int) -> list[int]:
    if spec:
        return [int(x) for x in spec.split(",")]
    return list(build_target_layer_ids(num_layers, k))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sglang_reanchor.train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prompts", help="write a prompt pool (JSONL) from the offline sources")
    p.add_argument("--out", required=True)
    p.add_argument("--source", action="append", default=[], metavar="NAME=COUNT",
                   help="most prompts from a source (0 drops it); sources and defaults: POOL_SOURCES "
                   "in sglang_reanchor/train/prompts.py")
    p.add_argument("--self-instruct", type=int, default=0, metavar="N",
                   help="add N prompts the target writes for itself (self_instruct.py)")
    p.add_argument("--self-instruct-only", action="store_true", help="write only those N prompts")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--target", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_prompts)

    d = sub.add_parser("data", help="build the self-distillation set (responses + features)")
    d.add_argument("--out", required=True)
    d.add_argument("--target", default=None, help="HF model folder (default: SmolLM2-135M-Instruct)")
    d.add_argument("--per-domain", type=int, default=200, help="prompts per domain (chat/code/math/general)")
    d.add_argument("--num-val", type=int, default=16, help="held-out validation prompts (may be 0 "
                   "for a further folder)")
    d.add_argument("--exclude", action="append", default=[], metavar="DIR",
                   help="skip prompts already used by this data folder (repeatable)")
    d.add_argument("--max-prompts", type=int, default=None, help="use at most this many prompts")
    d.add_argument("--prompts", default=None, help="a pool from the `prompts` command (default: "
                   "build_prompts(--seed, --per-domain))")
    d.add_argument("--max-prompt-tokens", type=int, default=512, help="skip longer prompts")
    d.add_argument("--pack", default=None, help="responses stored by the `pack` command: batches whose "
                   "responses are all in it only get their features computed")
    d.add_argument("--sort-window", type=int, default=1, help="sort prompts by length inside windows "
                   "of this many (less padding per batch; 1 keeps the order)")
    d.add_argument("--max-new-tokens", type=int, default=192)
    d.add_argument("--batch-size", type=int, default=128)
    d.add_argument("--layers", default=None, help="target layer ids, e.g. 1,10,18,27")
    d.add_argument("--num-feature-layers", type=int, default=4)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--dtype", default="auto", help="target precision for generation and features: auto "
                   "(bfloat16 with AMX / AVX-512 BF16 or CUDA, else float32), float32, bfloat16")
    d.set_defaults(func=_cmd_data)

    f = sub.add_parser("fit", help="train a drafter on a `data` folder")
    f.add_argument("--data", required=True, nargs="+", help="one or more `data` folders (the first "
                   "holds the validation prompts)")
    f.add_argument("--out", required=True)
    f.add_argument("--target", default=None)
    f.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    f.add_argument("--num-layers", type=int, default=2)
    f.add_argument("--intermediate-size", type=int, default=1536)
    f.add_argument("--block-size", type=int, default=16)
    f.add_argument("--mask-token-id", type=int, default=None)
    f.add_argument("--lr", type=float, default=6e-4)
    f.add_argument("--warmup", type=int, default=50)
    f.add_argument("--steps", type=int, default=2000, help="schedule length (cosine decay)")
    f.add_argument("--minutes", type=float, default=None, help="stop (and save) after this wall time")
    f.add_argument("--batch-seqs", type=int, default=4)
    f.add_argument("--anchors", type=int, default=16, help="anchors per sequence per step")
    f.add_argument("--gamma", type=float, default=7.0, help="loss weight exp(-(k-1)/gamma)")
    f.add_argument("--all-slots", action="store_true", help="score every slot with weight w_k instead "
                   "of sampling slot k with probability w_k (same loss in expectation, ~2x the lm_head work)")
    f.add_argument("--eval-every", type=int, default=200)
    f.add_argument("--save-every", type=int, default=50)
    f.add_argument("--val-tokens", type=int, default=64, help="new tokens per validation prompt")
    f.add_argument("--val-prompts", type=int, default=8, help="held-out prompts per validation during "
                   "training (the final one uses all)")
    f.add_argument("--random-init", action="store_true", help="do not copy target layers into the drafter")
    f.add_argument("--init-from", default=None, metavar="DIR", help="start from this z-lab drafter folder "
                   "(e.g. the shipped one) instead of the target's last layers")
    f.add_argument("--autocast", choices=("auto", "on", "off"), default="auto",
                   help="bfloat16 autocast of the forward: auto = where bfloat16 GEMMs are fast (CUDA, AMX, "
                   "AVX-512 BF16); off on other CPUs, where they are ~9x slower than float32")
    f.add_argument("--seed", type=int, default=0)
    f.set_defaults(func=_cmd_fit)

    k = sub.add_parser("pack", help="store the responses of data folders compactly (to commit, and to "
                       "rebuild the folders later with `data --pack`)")
    k.add_argument("--data", required=True, nargs="+")
    k.add_argument("--out", required=True, help="an .npz file")
    k.set_defaults(func=_cmd_pack)

    c = sub.add_parser("curve", help="training curve (JSON + PNG: val tau against labelled slots seen)")
    c.add_argument("--log", required=True, help="a fit run's log.jsonl")
    c.add_argument("--out", required=True, help="folder for curve.json and curve.png")
    c.add_argument("--title", default="")
    c.set_defaults(func=_cmd_curve)

    lc = sub.add_parser("learning-curve", help="tau of trained drafters against their data (JSON + PNG), "
                        "read from stored benchmark runs, with the log-linear trend and what it needs for a goal")
    lc.add_argument("--point", action="append", required=True, metavar="NAME:TOKENS:LABELS:RESULTS_JSON",
                    help="a drafter: response tokens trained on, labelled slots seen (- if not recorded), a "
                    "`bench` results.json of it with --methods dflash (repeatable; two or more)")
    lc.add_argument("--goal", type=float, default=3.0, help="the tau to project the data for")
    lc.add_argument("--out", required=True)
    lc.add_argument("--title", default="")
    lc.set_defaults(func=_cmd_learning_curve)

    v = sub.add_parser("draft-vocab", help="rank the target's response tokens by frequency into a drafter "
                       "folder (draft_vocab.safetensors: drafting over the top K only, `draft_vocab=K`)")
    v.add_argument("--data", required=True, nargs="+", help="`data` folders whose responses are counted")
    v.add_argument("--drafter", required=True, help="the drafter folder to write draft_vocab.safetensors into")
    v.set_defaults(func=_cmd_draft_vocab)

    e = sub.add_parser("export", help="write a z-lab folder from a checkpoint")
    e.add_argument("--ckpt", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--dtype", default="bfloat16")
    e.set_defaults(func=_cmd_export)

    args = ap.parse_args(argv)
    keep_freed_memory()  # 2.5x faster batched generation here (sglang_reanchor.runtime)
    args.func(args)


if __name__ == "__main__":
    main()
