"""Time the seeded T > 0 draw (`sglang_reanchor.sampling.seeded_draw`) against the formula it replaced.

    python scripts/bench_seeded_draw.py [--vocab 49152] [--rows 1 7 19 31] [--out seeded_draw.json]

The draw runs once per verified node of a sampled round (the reference engine with a seed, the
benchmark at T > 0, SGLang's seeded requests), over the whole vocabulary: a tree of 19 nodes draws
19 rows. Prints a table of milliseconds per call (median of repeats) for the Gumbel-max formula of
2026-12-04 (int64 hash, three float64 logarithms) and the current one (the same draws), and checks that
they agree. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from sglang_reanchor.sampling import _mix32, seeded_draw


def gumbel_max_reference(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The draw as first written: ``argmax(log p - log(-log u))``, every step in int64 / float64."""
    key = _mix32(_mix32(seeds ^ (seeds >> 32)) ^ _mix32(positions * 2 + 1))
    bits = _mix32(key[:, None] ^ _mix32(torch.arange(probs.shape[-1]) * 2 + 0x632BE5AB)[None])
    uniform = (bits.double() + 0.5) / 2.0**32
    return (probs.double().log() - torch.log(-torch.log(uniform))).argmax(-1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 7, 19, 31])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    table = []
    print(f"| rows | reference (ms) | seeded_draw (ms) | speed-up | equal draws |  vocab {args.vocab}, "
          f"{torch.get_num_threads()} threads")
    print("|---|---|---|---|---|")
    for m in args.rows:
        probs = (torch.randn(m, args.vocab, generator=gen) * 3).softmax(-1)
        seeds, positions = torch.full((m,), 5), torch.arange(m) + 100
        times = {}
        for name, fn in (("reference", gumbel_max_reference), ("seeded_draw", seeded_draw)):
            fn(probs, seeds, positions)  # warm-up (and the vocabulary hash's cache)
            laps = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn(probs, seeds, positions)
                laps.append((time.perf_counter() - t0) * 1e3)
            times[name] = statistics.median(laps)
        equal = bool(torch.equal(gumbel_max_reference(probs, seeds, positions), seeded_draw(probs, seeds, positions)))
        table.append({"rows": m, **times, "equal": equal})
        print(f"| {m} | {times['reference']:.2f} | {times['seeded_draw']:.2f} | "
              f"{times['reference'] / times['seeded_draw']:.1f}x | {equal} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": platform.platform(), "processor": platform.processor(), "vocab": args.vocab,
                       "threads": torch.get_num_threads(), "table": table}, f, indent=1)
    return 0 if all(r["equal"] for r in table) else 1


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    raise SystemExit(main())
