"""What one round core costs a GPU: host syncs and torch ops per step, counted on any machine.

``python -m sglang_reanchor.bench round-ops --out DIR`` runs the round core
(`sglang_reanchor.round`) over rounds with random acceptances and prints, per
configuration and batch size, the aten ops each step dispatches (views included, and
without views or host-side scalar wrappers: what would launch a kernel) and the host
syncs `SyncDetector` flags (the goal is 0). Writes ``round_ops.json`` and ``round_ops.md``.

The drafter and the target are stand-ins (`StandInPair`: deterministic tensor functions
of their inputs, a small vocabulary so drafts are often accepted): the models' own
forwards are not counted, only the round around them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..audit import OpCounter, SyncDetector
from ..config import ReAnchorConfig
from ..round import CommitPlan, RoundCore
from ..sampling import SamplingParams, sample_tokens
from ..srt.layout import verify_inputs
from ..suffix import SuffixStore

__all__ = ["StandInPair", "count_round", "device_round", "main"]

VOCAB, DIM, MASK = 4, 6, 3
VIEW_OPS = frozenset({"unsqueeze", "view", "expand", "slice", "select", "squeeze", "reshape", "alias", "t",
                      "transpose", "permute", "_unsafe_view", "as_strided", "detach", "scalar_tensor"})


class StandInPair:
    """Drafter and target stand-ins: pure tensor functions of their inputs, no host read."""

    def __init__(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.draft_table = torch.randint(0, VOCAB, (VOCAB, 64), generator=gen)
        self.target_table = torch.randn(VOCAB, 64, VOCAB, generator=gen)

    def draft(self, anchors: Tensor, positions: Tensor, width: int, noise: Tensor) -> Tensor:
        """``[bs, 1+R, W]``: each block's anchor then drafts that depend on anchor, position and noise."""
        k = torch.arange(1, width, device=anchors.device)
        col = (positions[:, :, None] + k + noise[:, None, None]) % 64
        drafts = self.draft_table[anchors[:, :, None].expand(-1, -1, width - 1), col]
        return torch.cat([anchors[:, :, None], drafts], dim=2)

    def verify(self, tokens: Tensor, positions: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits [bs, N, V], features [bs, N, D])`` of every node."""
        col = (positions + noise[:, None]) % 64
        logits = self.target_table[tokens, col] * 4
        features = torch.stack([tokens.float(), positions.float()] + [logits[..., i] for i in range(DIM - 2)], -1)
        return logits, features


@dataclass
class RoundState:
    """One batch's state between rounds: device tensors, and the host copy of the lengths."""

    core: RoundCore
    store: SuffixStore
    pair: StandInPair
    slots: Tensor  # [bs] long
    prefix: Tensor  # [bs] long (device)
    prefix_cpu: Tensor  # [bs] long (host: SGLang's seq_lens_cpu)
    bonus: Tensor  # [bs] long

    @staticmethod
    def new(config: ReAnchorConfig, bs: int, seed: int, num_drafts: int = 15) -> RoundState:
        core = RoundCore(config, num_drafts, "cpu", generator=torch.Generator().manual_seed(seed))
        store = SuffixStore(bs + 3, config.max_offset, DIM)
        slots = torch.randperm(bs + 3, generator=torch.Generator().manual_seed(seed))[:bs]
        prefix = torch.randint(1, 30, (bs,), generator=torch.Generator().manual_seed(seed + 1))
        return RoundState(core, store, StandInPair(seed), slots, prefix.clone(), prefix, torch.zeros(bs, dtype=torch.long))


def device_round(state: RoundState, noise: Tensor, params: SamplingParams, gen: torch.Generator | None,
                 host: dict[str, int], counters: dict[str, OpCounter] | None = None) -> CommitPlan:
    """The device part of a round, as SGLang's worker runs it (the verify FULL_MASK included).

    ``host``: ``max_prefix`` and ``prefix_sum`` of the committed lengths, read on the host.
    With ``counters``, each step's ops are counted into ``counters[step]`` (the stand-in
    models' are not). Updates ``state``'s device tensors; the host copy is the caller's.
    """
    core, store = state.core, state.store

    def step(name: str):
        return counters.setdefault(name, OpCounter()) if counters is not None else _Nothing()

    with step("suffix gather"):
        suffix = store.gather(state.slots, state.prefix)
    with step("anchors"):
        anchors = core.anchors(state.bonus, state.prefix, suffix, fill_token=MASK)
    blocks = state.pair.draft(anchors.tokens, anchors.positions, 1 + core.num_drafts, noise)
    with step("tree"):
        tree = core.tree(blocks, anchors, suffix)
    with step("verify mask (FULL_MASK)"):
        vin = verify_inputs(tree, state.prefix, **host)
    logits, features = state.pair.verify(tree.tokens, vin.positions.view(tree.tokens.shape), noise)
    top1 = logits.argmax(-1)
    picks = top1 if params.greedy else sample_tokens(logits, params, gen)
    with step("accept"):
        acc = core.accept(tree, picks, top1)
    with step("commit plan"):
        plan = core.commit(tree, acc, state.prefix)
    with step("suffix put"):
        store.put(state.slots, *core.next_suffix(acc, plan, features))
    state.prefix, state.bonus = plan.new_seq_lens, acc.bonus
    return plan


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def count_round(config: ReAnchorConfig, bs: int, rounds: int = 8, temperature: float = 0.0,
                seed: int = 0) -> dict:
    """Ops per step (the last round, after the suffix has filled) and syncs over ``rounds`` rounds."""
    state = RoundState.new(config, bs, seed)
    params = SamplingParams(temperature=temperature)
    gen = torch.Generator().manual_seed(seed)
    syncs: list[str] = []
    counters: dict[str, OpCounter] = {}
    taus: list[int] = []
    for r in range(rounds):
        noise = torch.randint(0, 64, (bs,), generator=gen)
        host = dict(max_prefix=int(state.prefix_cpu.max()), prefix_sum=int(state.prefix_cpu.sum()))
        with SyncDetector() as detector:
            plan = device_round(state, noise, params, gen, host, counters if r == rounds - 1 else None)
        syncs += [str(h) for h in detector.hits]
        state.prefix_cpu = state.prefix_cpu + plan.commit_lens  # the scheduler's host copy
        taus += plan.commit_lens.tolist()
    steps = {name: {"ops": c.total, "kernel_ops": sum(v for k, v in c.by_op.items() if k not in VIEW_OPS)}
             for name, c in counters.items()}
    core_steps = [s for s in steps if s != "verify mask (FULL_MASK)"]
    return {
        "config": _describe(config), "batch": bs, "temperature": temperature, "rounds": rounds,
        "mean_tau": sum(taus) / len(taus), "syncs": syncs, "steps": steps,
        "core_ops": sum(steps[s]["ops"] for s in core_steps),
        "core_kernel_ops": sum(steps[s]["kernel_ops"] for s in core_steps),
        "total_ops": sum(v["ops"] for v in steps.values()),
        "total_kernel_ops": sum(v["kernel_ops"] for v in steps.values()),
    }


def _describe(config: ReAnchorConfig) -> str:
    default = ReAnchorConfig()
    changed = {f: getattr(config, f) for f in ("offsets", "policy", "node_budget", "max_depth")
               if getattr(config, f) != getattr(default, f)}
    return json.dumps(changed) if changed else "defaults"


def markdown(rows: list[dict]) -> str:
    steps = list(rows[0]["steps"])
    lines = ["# Round core: ops and host syncs per round (stand-in models; 15 drafts per block)", "",
             "Ops: aten ops dispatched (views included) / without views and scalar wrappers (kernel launches "
             "on a GPU). `core` = every step but the FULL_MASK layout, which only the FlashInfer and Triton "
             "backends read.", "",
             "| config | bs | T | syncs | " + " | ".join(steps) + " | core | total |",
             "|---|---|---|---|" + "---|" * (len(steps) + 2)]
    for r in rows:
        cells = [f"{r['steps'][s]['ops']} / {r['steps'][s]['kernel_ops']}" for s in steps]
        lines.append(f"| `{r['config']}` | {r['batch']} | {r['temperature']:g} | {len(r['syncs'])} | "
                     + " | ".join(cells) + f" | {r['core_ops']} / {r['core_kernel_ops']} | "
                     f"{r['total_ops']} / {r['total_kernel_ops']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_reanchor.bench round-ops", description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    configs = [ReAnchorConfig(), ReAnchorConfig(offsets=()),
               ReAnchorConfig(policy="offset", node_budget=8, max_depth=3)]
    rows = [count_round(c, bs, args.rounds, temperature=t) for c in configs for bs in args.batch_sizes
            for t in (0.0, 1.0)]
    text = markdown(rows)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "round_ops.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "round_ops.md").write_text(text)
    return 0 if all(not r["syncs"] for r in rows) else 1
