"""Measure the CPU defaults of the shipped pair on this machine and record them in the drafter folder.

    python scripts/ship_device_defaults.py --dtype auto
    python scripts/ship_device_defaults.py --dtype float32
    python scripts/ship_device_defaults.py --dtype auto --temperature 1    # the choice for sampled requests

Runs the same measurement a new machine runs on first use (`sglang_reanchor.engine.defaults`:
plain decoding and each CPU candidate on two built-in prompts), three times, and writes the
candidate that won most often (ties: the higher median tokens/s) with its median tokens/s and
plain decoding's into ``sglang_reanchor/assets/smollm2-135m-dflash-b16/device_defaults.json``,
under this machine's key (CPU model, bfloat16 flags, torch threads, dtype); an entry with the
same key is replaced in place; its ``served`` fields are kept where the same config wins again, and dropped
otherwise (measured under load for the old choice: measure them again with ``scripts/load_bench.py``). The entry records plain decoding's speed beside the winner's, so that a
machine where no candidate beats plain decoding says so (the demo prints both). Run it with
nothing else on the machine.

With ``--temperature T`` > 0 the candidates decode with seeded draws at ``T`` (every method draws
the same tokens) and the winner goes into the existing entry's ``sampled`` field (the entry for
this machine must exist: run without ``--temperature`` first); `SpeculativeGenerator.generate`
runs it for sampled requests.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from collections import Counter
from dataclasses import asdict

import torch

from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator
from sglang_reanchor.engine.defaults import (
    MEASURE_PROMPTS,
    SHIPPED_FILE,
    _chat_ids,
    fitting_candidates,
    machine_key,
    measure_candidates,
)
from sglang_reanchor.hub import shipped_drafter_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="measure sampled decoding at this temperature (> 0: the entry's 'sampled' choice)")
    args = ap.parse_args(argv)
    if args.temperature < 0:
        ap.error(f"--temperature must be >= 0, got {args.temperature}")
    gen = SpeculativeGenerator.from_pretrained(config=ReAnchorConfig(), dtype=args.dtype)
    model, drafter = gen.target.model, gen.drafter
    print(f"linears packed: {gen.linear_packing}")
    candidates = fitting_candidates(drafter)
    prompts = [_chat_ids(gen.tokenizer, p) for p in MEASURE_PROMPTS]
    runs = [measure_candidates(lambda c: SpeculativeGenerator(model, drafter, config=c), prompts, candidates,
                               temperature=args.temperature) for _ in range(args.repeats)]
    for r in runs:
        print(f"{r.tokens_per_s:.1f} tok/s (plain {r.plain_tokens_per_s:.1f}): {r.config}")
    wins = Counter(r.config for r in runs)
    best = max(wins, key=lambda c: (wins[c], statistics.median(r.tokens_per_s for r in runs if r.config == c)))
    speed = statistics.median(r.tokens_per_s for r in runs if r.config == best)
    plain = statistics.median(r.plain_tokens_per_s for r in runs)
    if speed <= plain:
        print(f"note: no candidate beats plain decoding here ({speed:.1f} <= {plain:.1f} tok/s)")
    key = machine_key(model.device, model.dtype)
    path = shipped_drafter_path() / SHIPPED_FILE
    data = json.loads(path.read_text()) if path.is_file() else {"entries": []}
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(best).items()}
    weights = hashlib.sha256((path.parent / "model.safetensors").read_bytes()).hexdigest()[:12]
    if args.temperature > 0:  # the sampled choice of this machine's entry
        entry = next((e for e in data["entries"] if e["key"] == key), None)
        if entry is None:
            raise SystemExit(f"{path} has no entry for this machine ({key}): run without --temperature first")
        if entry.get("drafter_sha256") != weights:
            raise SystemExit(f"{path}: this machine's entry was measured with other weights; run without "
                             "--temperature first")
        entry["sampled"] = {"temperature": args.temperature, "config": config, "tokens_per_s": round(speed, 2),
                            "plain_tokens_per_s": round(plain, 2), "wins": f"{wins[best]}/{len(runs)}",
                            "command": " ".join(["python", *sys.argv])}
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {path}: sampled {entry['sampled']}")
        return 0
    entry = {"key": key, "config": config, "tokens_per_s": round(speed, 2), "plain_tokens_per_s": round(plain, 2),
             "wins": f"{wins[best]}/{len(runs)}", "command": " ".join(["python", *sys.argv]),
             "drafter_sha256": weights,  # the speeds were measured with these weights
             "linears_packed": gen.linear_packing.packed}  # ... and these kernels (engine.packed_linear)
    old = next((e for e in data["entries"] if e["key"] == key), None)
    if old is not None and old.get("served") and ReAnchorConfig(**old["config"]) == best:  # (fields added since
        # the entry was written take their defaults)
        entry["served"] = old["served"]  # measured under load for this same config: still its shape
    if old is not None and old.get("sampled") and old.get("drafter_sha256") == weights:
        entry["sampled"] = old["sampled"]  # measured with these weights, whatever wins at T = 0
    entries = data["entries"]  # replaced in place (a new key goes last): the file's diff shows what changed
    at = next((i for i, e in enumerate(entries) if e["key"] == key), len(entries))
    data["entries"] = entries[:at] + [entry] + entries[at + 1:]
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}: {entry}")
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    raise SystemExit(main())
