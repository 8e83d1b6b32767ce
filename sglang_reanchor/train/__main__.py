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
import math
import time
from pathlib import Path
from typing import Any

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
    from .selection import read_keys, select_prompts, truncate_responses

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
    known = read_pack(args.pack) if args.pack else None
    if args.max_response_tokens is not None:  # decode-length cap: stored responses cut, new ones capped
        args.max_new_tokens = min(args.max_new_tokens, args.max_response_tokens)
        known = truncate_responses(known, args.max_response_tokens) if known is not None else None
    if args.keys or args.exclude_keys or args.group or args.pack_only:  # after the held-out split
        if args.pack_only and known is None:
            raise SystemExit("data: --pack-only needs --pack")
        val, rest = prompts[: args.num_val], prompts[args.num_val:]
        rest = select_prompts(rest, keys=read_keys(args.keys) if args.keys else None,
                              exclude_keys=set().union(*(read_keys(f) for f in args.exclude_keys)) or None,
                              groups=args.group or None, known=known if args.pack_only else None)
        prompts = val + rest
    if args.max_prompts is not None:
        prompts = prompts[: args.max_prompts]
    if len(prompts) <= args.num_val:
        raise SystemExit(f"data: {len(prompts)} prompts left, need more than --num-val {args.num_val}")
    start = time.time()
    out = build_dataset(model, tok, prompts, args.out, layer_ids=layer_ids,
                        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                        num_val=args.num_val, max_prompt_tokens=args.max_prompt_tokens,
                        sort_window=args.sort_window,
                        known_responses=known,
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
    for pt in points:
        se = "n/a" if pt.tau_se is None else f"{pt.tau_se:.3f}"
        print(f"  {pt.name}: {pt.kind} {pt.tau:.3f} +- {se} at {pt.response_tokens} response tokens")
    print(f"{len(points)} points: tau = {fit['a']:.3f} + {fit['b']:.4f} ln(tokens) "
          f"(+{fit['tau_gain_per_doubling']:.3f} per doubling); tau {goal['tau']} on that line at "
          f"{goal['response_tokens_on_the_line']:.3g} response tokens "
          f"({goal['times_the_largest_point']:.3g}x the largest point) -> {args.out}/learning_curve.json, .png")


def _cmd_fit(args: argparse.Namespace) -> None:
    from .trainer import TrainSettings, fit

    model, tok = load_target(args.target, dtype=torch.float32)
    # the layer ids of the first folder that has begun (a build still to come writes its meta.json first;
    # load_sequences checks every folder agrees)
    metas = [Path(d) / "meta.json" for d in args.data if (Path(d) / "meta.json").exists()]
    if not metas:
        raise SystemExit(f"fit: none of the --data folders has a meta.json yet ({args.data}); run `data` first")
    meta = json.loads(metas[0].read_text())
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
        else args.autocast == "on",
        max_offset=args.max_offset, draft_vocab=args.draft_vocab, mix=_parse_mix(args.mix),
        save_minutes=args.save_minutes, snapshot_every=args.snapshot_every, val_anchors=args.val_anchors,
        val_max_offset=args.val_max_offset, reload_every=args.reload_every, stop_at=args.stop_at,
        head_only=args.head_only)
    fit(model, tok, config, args.data, args.out, settings, resume=args.resume, init_from=args.init_from,
        val_data=args.val_data)


def _parse_mix(spec: str | None) -> tuple[tuple[str, float], ...] | None:
    """``"math=1,stub=1,other=1"`` -> ``(("math", 1.0), ...)``; None stays None."""
    if not spec:
        return None
    out = []
    for item in spec.split(","):
        name, eq, w = item.partition("=")
        if not eq or name not in ("math", "stub", "other"):
            raise SystemExit(f"fit: --mix {spec!r}: each item is GROUP=WEIGHT with GROUP in math, stub, other")
        try:
            out.append((name, float(w)))
        except ValueError:
            raise SystemExit(f"fit: --mix {spec!r}: weight {w!r} of {name} is not a number") from None
    return tuple(out)


def _cmd_validate(args: argparse.Namespace) -> None:
    from .validate import validate_drafters

    model, _ = load_target(args.target, dtype=torch.float32)
    report = validate_drafters(model, args.drafter, args.val_data, args.out, draft_vocab=args.draft_vocab,
                               anchors_per_seq=args.anchors, max_offset=args.max_offset, full_head=args.full_head)
    for name, r in report["drafters"].items():
        for head, v in r.items():
            print(f"{name} [{head}]: teacher-forced acceptance {v['accept']:.4f} +- {v['accept_se']:.4f} "
                  f"(all anchors {v['accept_all']:.4f} +- {v['accept_all_se']:.4f}; first draft accepted "
                  f"{v['first_draft_accepted']:.3f}; {v['anchors']} anchors)")
    for d in report["paired"]:
        print(f"{d['drafter']} - {d['baseline']} [{d['head']}]: {d['diff']:+.4f} +- {d['diff_se']:.4f} (paired)")


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


def _copy_training_sidecar(backbone: str, out: str) -> None:
    sidecar = Path(backbone) / "training.json"  # the backbone's training, so `fit` keeps counting
    if sidecar.exists():
        (Path(out) / "training.json").write_text(sidecar.read_text())


def _cmd_add_head(args: argparse.Namespace) -> None:
    from ..drafter import DFlashDrafter
    from .heads import with_domino_head, with_dspark_head, with_head_of

    drafter = DFlashDrafter.from_pretrained(args.drafter)
    if args.head_from:  # a trained head carried over: its family and shape are the folder's
        try:
            new = with_head_of(DFlashDrafter.from_pretrained(args.head_from), drafter)
        except ValueError as e:
            raise SystemExit(f"add-head --head-from {args.head_from}: {e}") from None
        new.save_pretrained(args.out)
        _copy_training_sidecar(args.drafter, args.out)
        print(f"{args.out}: the {new.family_name} head of {args.head_from} on the backbone of {args.drafter}. "
              f"Adapt it with `fit --init-from {args.out} --head-only`")
        return
    if args.family == "dspark":
        new = with_dspark_head(drafter, args.markov_rank, args.markov_head_type, seed=args.seed)
        what = f"DSpark drafter ({args.markov_head_type} Markov head, rank {args.markov_rank}, gamma {new.gamma}"
    else:
        new = with_domino_head(drafter, args.gru_hidden_dim, args.emb_dim, seed=args.seed)
        what = f"Domino drafter (GRU correction head, gru_hidden_dim {args.gru_hidden_dim}, emb_dim {args.emb_dim}"
    new.save_pretrained(args.out)
    _copy_training_sidecar(args.drafter, args.out)
    print(f"{args.out}: {what}, DFlash's query layout) on the backbone of {args.drafter}; its correction starts "
          f"at zero. Train the head with `fit --init-from {args.out} --head-only`")


def _cmd_confidence(args: argparse.Namespace) -> None:
    from ..drafter import DFlashDrafter
    from ..drafter.draft_vocab import DraftVocabHead, top_tokens
    from ..drafter.dspark import DSparkDrafter
    from .confidence import confidence_report
    from .data import load_sequences
    from .selection import group_folders

    model, _ = load_target(args.target, dtype=torch.float32)
    drafter = DFlashDrafter.from_pretrained(args.drafter, dtype=torch.float32)
    if not isinstance(drafter, DSparkDrafter):
        raise SystemExit(f"confidence: {args.drafter} is a {drafter.family_name} drafter; the confidence head is "
                         "DSpark's (make one with `train add-head --family dspark`)")
    ids = None
    head = model.get_output_embeddings()
    if args.draft_vocab:
        if drafter.vocab_ranking is None:
            raise SystemExit(f"confidence: {args.drafter} has no draft_vocab.safetensors for --draft-vocab "
                             f"{args.draft_vocab} (0: the full head)")
        ids = top_tokens(drafter.vocab_ranking, args.draft_vocab, str(args.drafter))
        head = DraftVocabHead(head, ids)
    train, val = load_sequences(*args.data), load_sequences(args.val_data)
    report = confidence_report(
        drafter, model.get_input_embeddings(), head, (train, group_folders(args.data)),
        (val, group_folders([args.val_data])), sequences=args.sequences, anchors_per_seq=args.anchors,
        max_offset=args.max_offset, head_ids=ids, with_markov=not args.without_markov, l2=args.l2, seed=args.seed)
    drafter.to(torch.bfloat16 if args.dtype == "bfloat16" else torch.float32).save_pretrained(args.out)
    for name in ("draft_vocab.safetensors", "training.json"):
        if (Path(args.drafter) / name).exists():
            (Path(args.out) / name).write_bytes((Path(args.drafter) / name).read_bytes())
    (Path(args.out) / "confidence.json").write_text(json.dumps(report, indent=1) + "\n")
    print(format_confidence_report(report))
    print(f"-> {args.out} (enable_confidence_head: true; the report in {args.out}/confidence.json)")


def format_confidence_report(report: dict[str, Any]) -> str:
    """The held-out part of `confidence.confidence_report` as a text table."""
    v = report["val"]
    lines = [f"held-out: {v['blocks']} blocks, {v['slots_reached']} slots reached; AUC on reached slots: "
             + ", ".join(f"{k} {a:.3f}" for k, a in v["auc_reached"].items())
             + f"; mean confidence {v['mean_confidence_reached']:.3f} vs accepted {v['accept_rate_reached']:.3f}",
             "cap | fixed: verified  accepted | " + " | ".join(f"{k}: accepted at equal verified (gain), "
                                                              "verified for equal accepted" for k in v["curve"]["matched"])]
    for i, f in enumerate(v["curve"]["fixed"]):
        row = [f"{i + 1:3d} | {f['verified']:15.2f} {f['accepted']:9.3f}"]
        for k, rows in v["curve"]["matched"].items():
            m = rows[i]
            if math.isnan(m["accepted_gain"]):  # the cap verifies less than any threshold does
                row.append("-")
                continue
            row.append(f"{m['fixed_accepted'] + m['accepted_gain']:.3f} ({m['accepted_gain']:+.3f}), "
                       f"{m['verified_ratio']:.2f}x")
        lines.append(" | ".join(row))
    return "\n".join(lines)


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
    d.add_argument("--max-response-tokens", type=int, default=None, help="cut stored responses to this many "
                   "tokens and generate at most this many (the decode length the drafter is trained for)")
    d.add_argument("--pack-only", action="store_true", help="only prompts with a response in --pack (no "
                   "generation; the --num-val held-out prompts are kept)")
    d.add_argument("--keys", default=None, metavar="FILE", help="only prompts whose prompt_key is listed "
                   "(one per line; e.g. a held-out set)")
    d.add_argument("--exclude-keys", action="append", default=[], metavar="FILE",
                   help="skip prompts whose prompt_key is listed (repeatable)")
    d.add_argument("--group", action="append", default=[], choices=("math", "stub", "other"),
                   help="only prompts of this group (selection.prompt_group; repeatable)")
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
    f.add_argument("--max-offset", type=int, default=None, help="anchors at response positions below this "
                   "(95: where a 96-token decode draws them; default anywhere)")
    f.add_argument("--draft-vocab", type=int, default=None, metavar="K", help="cross-entropy over the top K "
                   "tokens of the drafter's draft_vocab.safetensors (needs --init-from a folder with one)")
    f.add_argument("--mix", default=None, metavar="math=W,stub=W,other=W", help="draw sequences by prompt "
                   "group with these weights (selection.prompt_group; default: uniform over sequences)")
    f.add_argument("--save-minutes", type=float, default=10.0, help="also checkpoint this often (minutes)")
    f.add_argument("--snapshot-every", type=int, default=0, help="keep OUT/ckpt_stepN.pt every N steps")
    f.add_argument("--val-data", default=None, metavar="DIR", help="a `data` folder of held-out sequences: "
                   "teacher-forced block acceptance (with its SE) at each validation")
    f.add_argument("--val-anchors", type=int, default=8, help="teacher-forced anchors per held-out sequence")
    f.add_argument("--val-max-offset", type=int, default=95, help="... below this response position")
    f.add_argument("--stop-at", type=int, default=None, metavar="STEP", help="end this sitting at this step "
                   "(resume later with --resume; the schedule stays over --steps)")
    f.add_argument("--reload-every", type=int, default=0, metavar="N", help="every N steps, pick up shards a "
                   "running `data` build has written since (0: never)")
    f.add_argument("--head-only", action="store_true", help="train only the family head of an --init-from "
                   "DSpark or Domino drafter (its Markov head, its GRU correction); the backbone stays frozen")
    f.set_defaults(func=_cmd_fit)

    h = sub.add_parser("add-head", help="a DSpark or Domino drafter folder (SGLang's formats) from a DFlash one: "
                       "the same backbone and a new head whose correction starts at zero (train it with "
                       "`fit --head-only`)")
    h.add_argument("--drafter", required=True, metavar="DIR", help="a DFlash drafter folder (the backbone)")
    h.add_argument("--out", required=True, metavar="DIR")
    h.add_argument("--family", choices=("dspark", "domino"), default="dspark")
    h.add_argument("--markov-rank", type=int, default=64, help="DSpark: the Markov head's rank")
    h.add_argument("--markov-head-type", choices=("vanilla", "gated", "rnn"), default="gated", help="DSpark")
    h.add_argument("--gru-hidden-dim", type=int, default=128, help="Domino: the prefix GRU's state size")
    h.add_argument("--emb-dim", type=int, default=64, help="Domino: embed_proj's inner width (embed_proj.2 is "
                   "[vocab, emb_dim], most of the head's size)")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--head-from", default=None, metavar="DIR", help="a trained DSpark or Domino folder: carry its "
                   "head onto --drafter's backbone (same shape) instead of a new one; its family and head shape "
                   "are the folder's (the options above are not used)")
    h.set_defaults(func=_cmd_add_head)

    t = sub.add_parser("validate", help="teacher-forced block acceptance of drafter folders on held-out "
                       "sequences (mean +- SE, per group, paired differences against the first)")
    t.add_argument("--drafter", required=True, nargs="+", metavar="DIR", help="z-lab drafter folders (the "
                   "first is the baseline of the paired differences)")
    t.add_argument("--val-data", required=True, metavar="DIR", help="a `data` folder of held-out sequences")
    t.add_argument("--out", required=True, help="a JSON file")
    t.add_argument("--draft-vocab", type=int, default=8192, metavar="K", help="score the top-K reduced head "
                   "(0: skip it)")
    t.add_argument("--full-head", action="store_true", help="also score the full 49k head")
    t.add_argument("--anchors", type=int, default=8, help="anchors per held-out sequence")
    t.add_argument("--max-offset", type=int, default=95, help="anchors below this response position")
    t.add_argument("--target", default=None)
    t.set_defaults(func=_cmd_validate)

    cf = sub.add_parser("confidence", help="fit a DSpark drafter's confidence head (per-slot acceptance, "
                        "teacher-forced) and measure it on held-out blocks as a verify-length signal")
    cf.add_argument("--drafter", required=True, metavar="DIR", help="a DSpark drafter folder (DFlash's query layout)")
    cf.add_argument("--data", required=True, nargs="+", metavar="DIR", help="`data` folders to fit on")
    cf.add_argument("--val-data", required=True, metavar="DIR", help="a `data` folder of held-out sequences")
    cf.add_argument("--out", required=True, metavar="DIR", help="the drafter folder to write (with the head)")
    cf.add_argument("--sequences", type=int, default=4096, help="sequences of --data to fit on (a random subset)")
    cf.add_argument("--anchors", type=int, default=8, help="anchors per sequence")
    cf.add_argument("--max-offset", type=int, default=95, help="anchors below this response position")
    cf.add_argument("--draft-vocab", type=int, default=8192, metavar="K", help="draft with the top-K head "
                    "(0: the full head), as decoding with draft_vocab=K does")
    cf.add_argument("--without-markov", action="store_true", help="the head reads the slot's hidden state only "
                    "(confidence_head_with_markov: false)")
    cf.add_argument("--l2", type=float, default=1e-4, help="L2 penalty on the head's weights")
    cf.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="of the written folder")
    cf.add_argument("--seed", type=int, default=0)
    cf.add_argument("--target", default=None)
    cf.set_defaults(func=_cmd_confidence)

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
