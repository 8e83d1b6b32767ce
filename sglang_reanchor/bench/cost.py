"""Cost model: measured verify/draft time against size, and the defaults that maximise tokens/s.

On a GPU a 60-node verify costs about what a 16-node one does; on a CPU it does
not, so the node budget and the offsets ``D`` must be chosen by predicted
tokens/s, not by tau alone:

    round_seconds(nodes, rows, m) = verify(nodes) + draft(rows, m) + overhead
    tokens/s(D, budget, m)        = E[tau(D, budget, m)] / E[round_seconds]

``verify(n)`` is the target forward over ``n`` tree nodes after a realistic
prefix, ``draft(r)`` the drafter forward over ``r = 1 + |D|`` blocks (both
measured, interpolated piecewise linearly), ``overhead`` the rest of a round
(tree build, acceptance, cache compaction; fitted from DFlash runs).
``E[tau(D, budget)]`` comes from traced ReAnchor runs with a large budget:
nodes are numbered parents first, so a smaller budget keeps exactly the
accepted nodes with id < budget (`analysis.budget_taus`). A depth cap ``m``
(``ReAnchorConfig.max_depth``) is predicted the same way from the same traces
(`analysis.capped_taus`), for DFlash's chain too; the drafter is measured
with only ``m`` drafts per block read (``draft(rows, m)``).

`CostProfile` is saved as JSON (``python -m sglang_reanchor.bench cost``);
`profile_config` turns its chosen defaults into a `ReAnchorConfig`, and
``CostProfile.budget_policy`` into the run-time budget chooser
(`sglang_reanchor.budget`: ``reanchor:node_budget=auto`` in the benchmark).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..budget import BatchBudget, BudgetPolicy, interpolate
from ..config import ReAnchorConfig
from ..drafter import DFlashDrafter, DraftContextCache, draft_blocks
from ..engine import TargetModel
from ..precision import cpu_bf16_flags
from .metrics import Record

__all__ = ["CostProfile", "best_per_depth", "measure_profile", "budget_curve", "choose_defaults", "profile_config"]

VERIFY_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128)
DRAFT_ROWS: tuple[int, ...] = (1, 2, 3, 4, 5, 7)


@dataclass
class CostProfile:
    """Measured costs on one machine for one target/drafter pair (seconds)."""

    prefix: int  # committed tokens before the measured forwards
    verify_s: dict[int, float]  # tree nodes -> target forward seconds
    draft_s: dict[int, float]  # drafter blocks (1 + |D|) -> drafter forward seconds
    target_token_s: float  # plain decoding: one target forward of one token
    overhead_s: float = 0.0  # per round, besides the two forwards
    defaults: dict[str, object] = field(default_factory=dict)  # chosen ReAnchorConfig fields
    machine: str = ""
    dtype: str = ""  # precision of target and drafter when measured ("float32", "bfloat16")
    cpu_bf16_flags: list[str] = field(default_factory=list)  # the CPU's AMX / AVX-512 BF16 flags
    draft_capped_s: dict[int, dict[int, float]] = field(default_factory=dict)  # depth cap m -> blocks -> s
    packed_linears: bool = False  # float32 linears on oneDNN weights packed once (`engine.packed_linear`)

    def verify(self, nodes: float) -> float:
        return interpolate(self.verify_s, nodes)

    def draft(self, rows: float, max_depth: int | None = None) -> float:
        """Drafter forward over ``rows`` blocks, reading ``max_depth`` drafts of each (None: all)."""
        if max_depth is None or max_depth not in self.draft_capped_s:
            return interpolate(self.draft_s, rows)
        return interpolate(self.draft_capped_s[max_depth], rows)

    def round_seconds(self, nodes: float, rows: float, max_depth: int | None = None) -> float:
        return self.verify(nodes) + self.draft(rows, max_depth) + self.overhead_s

    def budget_policy(self, offsets: Sequence[int], **kwargs: object) -> BudgetPolicy:
        """The run-time budget chooser (`sglang_reanchor.budget`) for ReAnchor with
        ``offsets``: measured verify curve, drafter forward over ``1 + |offsets|``
        blocks plus the per-round overhead as the fixed part. ``kwargs`` go to
        `BudgetPolicy` (``candidates``, ``explore_every``, ``decay``)."""
        return BudgetPolicy(verify_seconds=dict(self.verify_s),
                            fixed_seconds=self.draft(1 + len(offsets)) + self.overhead_s, **kwargs)  # type: ignore[arg-type]

    def batch_budget(self, offsets: Sequence[int], max_depth: int | None = None, **kwargs: object) -> BatchBudget:
        """The server's batch-aware budget (`sglang_reanchor.budget.BatchBudget`) for ReAnchor
        with ``offsets``: measured verify curve, drafter forward per block count (at the
        depth cap, where measured). ``kwargs`` go to `BatchBudget` (``candidates``, ...)."""
        draft = self.draft_capped_s.get(max_depth) if max_depth is not None else None
        return BatchBudget(verify_seconds=dict(self.verify_s), draft_seconds=dict(draft or self.draft_s),
                           blocks_per_request=1 + len(offsets), fixed_seconds=self.overhead_s,
                           **kwargs)  # type: ignore[arg-type]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @staticmethod
    def load(path: str | Path) -> CostProfile:
        raw = json.loads(Path(path).read_text())
        raw["verify_s"] = {int(k): float(v) for k, v in raw["verify_s"].items()}
        raw["draft_s"] = {int(k): float(v) for k, v in raw["draft_s"].items()}
        raw["draft_capped_s"] = {int(m): {int(k): float(v) for k, v in c.items()}
                                 for m, c in raw.get("draft_capped_s", {}).items()}
        return CostProfile(**raw)


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def measure_profile(target: torch.nn.Module, drafter: DFlashDrafter, prefix: int = 256,
                    sizes: Sequence[int] = VERIFY_SIZES, rows: Sequence[int] = DRAFT_ROWS,
                    repeats: int = 5, seed: int = 0, depths: Sequence[int] = ()) -> CostProfile:
    """Time target forwards over ``sizes`` tree nodes and drafter forwards over ``rows`` blocks
    (reading all drafts, and only ``m`` per block for each depth cap ``m`` in ``depths``).

    Verify inputs are chains under an explicit tree mask (the engine always passes
    one) after a random ``prefix``; the cache is cut back after every forward.
    """
    tm = TargetModel(target, tuple(drafter.target_layer_ids))
    dev = tm.device
    g = torch.Generator().manual_seed(seed)
    vocab = tm.config.vocab_size
    cache = tm.new_cache()
    prompt = torch.randint(vocab, (1, prefix), generator=g)
    out = tm.forward(prompt, torch.arange(prefix)[None], cache, features=True, last_only=True)
    empty = torch.zeros(0, dtype=torch.long, device=dev)

    def verify(n: int) -> None:
        ids = torch.randint(vocab, (1, n), generator=g)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        tm.forward(ids, prefix + torch.arange(n)[None], cache, mask)
        tm.keep_tokens(cache, prefix, empty)

    def decode_one() -> None:
        tm.forward(torch.randint(vocab, (1, 1), generator=g), torch.tensor([[prefix]]), cache, features=False)
        tm.keep_tokens(cache, prefix, empty)

    verify_s = {n: _median_time(lambda n=n: verify(n), repeats) for n in sizes}
    token_s = _median_time(decode_one, repeats)

    dcache = DraftContextCache()
    dcache.append(drafter.project_context(out.features, torch.arange(prefix, device=dev)[None]))

    def draft(r: int, m: int | None = None) -> None:
        offs = list(range(1, r))
        extra = out.features[:, prefix - max(offs):] if offs else None
        draft_blocks(drafter, dcache, anchors=torch.randint(vocab, (1, r), generator=g).to(dev),
                     anchor_positions=torch.tensor([[prefix] + [prefix + d for d in offs]], device=dev),
                     extra_features=extra, extra_visible=torch.tensor([[0] + offs], device=dev),
                     embed_tokens=tm.embed_tokens, lm_head=tm.lm_head, num_drafts=m)

    draft_s = {r: _median_time(lambda r=r: draft(r), repeats) for r in rows}
    capped = {m: {r: _median_time(lambda r=r, m=m: draft(r, m), repeats) for r in rows}
              for m in depths if m < drafter.block_size - 1}
    return CostProfile(prefix=prefix, verify_s=verify_s, draft_s=draft_s, target_token_s=token_s,
                       draft_capped_s=capped,
                       machine=f"{torch.get_num_threads()} torch threads, {dev}, {platform.processor() or '?'}",
                       dtype=str(tm.dtype).removeprefix("torch."), cpu_bf16_flags=list(cpu_bf16_flags()))


def mean_rows(records: Sequence[Record]) -> float:
    """Drafter blocks per round actually run (1 + shifted rows; fewer when the suffix is short)."""
    rounds = sum(r.rounds for r in records)
    shifted = sum(r.stats.get("alignment", {}).get("rows", 0) for r in records)
    return 1.0 + shifted / rounds if rounds else 1.0


def fit_overhead(profile: CostProfile, records: Sequence[Record], method: str = "dflash") -> float:
    """Per-round time of ``method``'s records not explained by the two forwards (>= 0).

    For ReAnchor this includes building the tree and the larger acceptance work.
    """
    recs = [r for r in records if r.method == method and r.rounds]
    if not recs:
        return 0.0
    per_round = sum(r.seconds - r.prefill_seconds for r in recs) / sum(r.rounds for r in recs)
    sizes = [s for r in recs for s in r.tree_sizes]
    model = profile.verify(sum(sizes) / len(sizes)) + profile.draft(mean_rows(recs))
    return max(0.0, per_round - model)


def budget_curve(profile: CostProfile, records: Sequence[Record]) -> list[dict[str, float | str]]:
    """Predicted tau, nodes and tokens/s per (ReAnchor spec, node budget), plus target and DFlash.

    ``records`` must be traced (``Record.stats["budget_tau"]``). Drafter blocks per
    round are those the spec's runs actually drafted; ReAnchor's extra per-round
    overhead over DFlash's (tree building) is fitted from its own runs.
    """
    from .methods import MethodSpec

    rows: list[dict[str, float | str]] = [
        {"method": "target", "budget": 1, "max_depth": 0, "tau": 1.0, "nodes": 1.0,
         "round_ms": 1e3 * profile.target_token_s, "tokens_per_s": 1.0 / profile.target_token_s}]

    def row(label: str, budget: float, depth: int | None, tau: float, nodes: float, sec: float) -> None:
        rows.append({"method": label, "budget": budget, "max_depth": depth or 0, "tau": tau, "nodes": nodes,
                     "round_ms": 1e3 * sec, "tokens_per_s": tau / sec})

    by_method: dict[str, list[Record]] = {}
    for r in records:
        by_method.setdefault(r.method, []).append(r)
    for label, recs in by_method.items():
        spec = MethodSpec.parse(label) if label != "diagnostic" else None
        if spec is None or spec.method == "target":
            continue
        n_rounds = sum(r.rounds for r in recs)
        capped = sorted({tuple(map(int, k.split("@"))) for r in recs for k in r.stats.get("capped_tau", {})})
        if spec.method == "dflash":
            tau = sum(sum(r.taus) for r in recs) / n_rounds
            nodes = sum(sum(r.tree_sizes) for r in recs) / n_rounds
            row(label, nodes, None, tau, nodes, profile.round_seconds(nodes, 1))
            widest = {m: b for b, m in capped}  # a chain: the largest budget keeps all m + 1 nodes
            for m, b in sorted(widest.items()):
                tau = sum(r.stats["capped_tau"][f"{b}@{m}"] for r in recs) / n_rounds
                nodes = sum(r.stats["capped_nodes"][f"{b}@{m}"] for r in recs) / n_rounds
                row(label, nodes, m, tau, nodes, profile.round_seconds(nodes, 1, m))
            continue
        n_rows = mean_rows(recs)
        extra = fit_overhead(profile, recs, label) - profile.overhead_s  # tree building etc.
        budgets = sorted({int(b) for r in recs for b in r.stats.get("budget_tau", {})})
        for b in budgets:
            tau = sum(r.stats["budget_tau"][str(b)] for r in recs) / n_rounds
            nodes = sum(r.stats["budget_nodes"][str(b)] for r in recs) / n_rounds
            row(label, b, None, tau, nodes, profile.round_seconds(nodes, n_rows) + extra)
        for b, m in capped:
            tau = sum(r.stats["capped_tau"][f"{b}@{m}"] for r in recs) / n_rounds
            nodes = sum(r.stats["capped_nodes"][f"{b}@{m}"] for r in recs) / n_rounds
            row(label, b, m, tau, nodes, profile.round_seconds(nodes, n_rows, m) + extra)
    return rows


def choose_defaults(curve: Sequence[dict[str, float | str]]) -> dict[str, object]:
    """The ReAnchor (policy, offsets, node budget, depth cap) with the highest predicted
    tokens/s; also the best depth cap for DFlash's chain (``dflash_max_depth``)."""
    from .methods import MethodSpec

    def fastest(prefix: str) -> dict[str, float | str]:
        return max((r for r in curve if str(r["method"]).startswith(prefix)), key=lambda r: float(r["tokens_per_s"]))

    best = fastest("reanchor")
    config = MethodSpec.parse(str(best["method"])).config(ReAnchorConfig())
    out: dict[str, object] = {"policy": config.policy, "offsets": list(config.offsets),
                              "node_budget": int(best["budget"]), "max_depth": int(best.get("max_depth", 0)) or None,
                              "predicted_tokens_per_s": float(best["tokens_per_s"]),
                              "predicted_tau": float(best["tau"])}
    if any(r["method"] == "dflash" for r in curve):
        chain = fastest("dflash")
        out |= {"dflash_max_depth": int(chain.get("max_depth", 0)) or None,
                "dflash_predicted_tokens_per_s": float(chain["tokens_per_s"])}
    return out


def profile_config(profile: CostProfile | str | Path, base: ReAnchorConfig | None = None) -> ReAnchorConfig:
    """``base`` (default `ReAnchorConfig()`) with the profile's chosen policy, offsets, node
    budget and depth cap (profiles written before the depth cap keep ``base``'s)."""
    prof = profile if isinstance(profile, CostProfile) else CostProfile.load(profile)
    base = base or ReAnchorConfig()
    if not prof.defaults:
        return base
    d = prof.defaults
    return base.replace(offsets=tuple(int(x) for x in d["offsets"]),  # type: ignore[union-attr]
                        node_budget=int(d["node_budget"]),  # type: ignore[arg-type]
                        policy=d.get("policy", base.policy),
                        max_depth=d.get("max_depth", base.max_depth))


def best_per_depth(curve: Sequence[dict[str, float | str]]) -> list[dict[str, float | str]]:
    """Per (method, depth cap): the curve row of the fastest node budget, in curve order."""
    best: dict[tuple[str, int], dict[str, float | str]] = {}
    for r in curve:
        key = (str(r["method"]), int(r.get("max_depth", 0)))
        if key not in best or float(r["tokens_per_s"]) > float(best[key]["tokens_per_s"]):
            best[key] = r
    return list(best.values())


def plot_curve(profile: CostProfile, curve: Sequence[dict[str, float | str]], path: Path) -> bool:
    """Left: measured verify/draft time vs size. Right: predicted tokens/s vs depth cap
    (each at its fastest node budget; the rightmost point is no cap)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = sorted(profile.verify_s)
    a.plot(xs, [1e3 * profile.verify_s[x] for x in xs], "o-", label="verify (target, N nodes)")
    rs = sorted(profile.draft_s)
    a.plot(rs, [1e3 * profile.draft_s[r] for r in rs], "s-", label="draft (drafter, N blocks)")
    a.set_xlabel("tree nodes / drafter blocks")
    a.set_ylabel("ms per forward")
    a.set_title(f"cost at prefix {profile.prefix}")
    a.legend()
    best = best_per_depth(curve)
    uncapped = 1 + max((int(r.get("max_depth", 0)) for r in best), default=0)
    for label in dict.fromkeys(str(r["method"]) for r in best if r["method"] != "target"):
        pts = sorted(((int(r.get("max_depth", 0)) or uncapped, float(r["tokens_per_s"]))
                      for r in best if r["method"] == label))
        b.plot([x for x, _ in pts], [y for _, y in pts], "o-", ms=3, label=label)
    plain = next((float(r["tokens_per_s"]) for r in curve if r["method"] == "target"), None)
    if plain is not None:
        b.axhline(plain, ls="--", color="gray", lw=1)
        b.text(1, plain, "target", va="bottom", fontsize=8)
    b.set_xlabel(f"max_depth (each at its best node budget; {uncapped} = no cap)")
    b.set_ylabel("predicted tokens/s")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def cost_markdown(profile: CostProfile, curve: Sequence[dict[str, float | str]], command: str = "") -> str:
    """The measured cost table and the predicted tokens/s per (spec, budget)."""
    base = profile.verify_s[min(profile.verify_s)]
    flags = ", ".join(profile.cpu_bf16_flags) or "none"
    lines = [f"# Cost model ({profile.machine}, prefix {profile.prefix})\n",
             f"Precision: {profile.dtype or '?'}; CPU bfloat16 matrix flags: {flags}.\n",
             "| tree nodes | verify ms | relative to 1 node |", "|---|---|---|"]
    lines += [f"| {n} | {1e3 * s:.1f} | {s / base:.2f} |" for n, s in sorted(profile.verify_s.items())]
    lines += ["", "| drafter blocks (1+|D|) | draft ms |", "|---|---|"]
    lines += [f"| {r} | {1e3 * s:.1f} |" for r, s in sorted(profile.draft_s.items())]
    lines += ["", f"Plain decoding: {1e3 * profile.target_token_s:.1f} ms/token. "
              f"Per-round overhead besides the forwards (fitted on DFlash runs): {1e3 * profile.overhead_s:.1f} ms.",
              "", "## Predicted tokens/s per method and depth cap, each at its fastest node budget "
              "(development prompts)\n",
              "| method | max_depth | budget | tau | nodes/round | ms/round | tokens/s |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {int(r.get('max_depth', 0)) or '–'} | {float(r['budget']):.0f} | "
              f"{float(r['tau']):.2f} | {float(r['nodes']):.1f} | {float(r['round_ms']):.1f} | "
              f"{float(r['tokens_per_s']):.1f} |" for r in best_per_depth(curve)]
    if profile.draft_capped_s:
        depths = sorted(profile.draft_capped_s)
        lines += ["", "Drafter ms with only `max_depth` drafts read per block (rows: blocks):", "",
                  "| blocks | " + " | ".join(f"m={m}" for m in depths) + " |", "|---" * (len(depths) + 1) + "|"]
        lines += [f"| {r} | " + " | ".join(f"{1e3 * profile.draft_capped_s[m].get(r, float('nan')):.1f}"
                                            for m in depths) + " |" for r in sorted(profile.draft_s)]
    lines += ["", f"Chosen defaults: `{profile.defaults}`", ""]
    if command:
        lines += ["```", command, "```", ""]
    return "\n".join(lines)
