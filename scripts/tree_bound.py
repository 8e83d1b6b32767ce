"""How far trees over a drafter's own top tokens can draft: best-first trees against the top-K bound.

DFlash's chain runs greedily over benchmark prompts; every verify round records the drafter's
distribution at each baseline slot (what branching reads: DFlash's logits, a Domino or DSpark
head's corrected scores) and the target's own continuation. Offline, for each round:

- the **top-K bound** ``tau_K``: 1 + the deepest depth ``d`` such that at every depth ``<= d`` the
  target's token is among the slot's ``K`` most likely. No tree whose nodes are top-K tokens of
  their slot accepts more in that round, whatever its budget; ``tau_1`` is the chain's own tau
  (checked against the engine's rounds);
- the tau of **DDTree's best-first tree** (`branching`, ``branch_shape="best_first"``) at each node
  budget and width, built from the recorded distributions by the library's own code and walked
  along the target's tokens (at T = 0 a round accepts the deepest node whose path is the
  target's).

Rounds are the chain's (the anchors a tree decode would meet differ a little), so the figures are
per-round means over the same rounds: what the same anchors would accept with each tree.

    .venv/bin/python scripts/tree_bound.py --limit 6 --out results/DIR/tree_bound
    .venv/bin/python scripts/tree_bound.py --drafter sglang_reanchor/assets/smollm2-135m-domino-b16 --out ...

Prints a table and writes ``tree_bound.json`` (and ``tree_bound.md``) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_reanchor import round as round_module  # noqa: E402
from sglang_reanchor.bench.__main__ import load_pair, load_samples  # noqa: E402
from sglang_reanchor.branching import branch_candidates  # noqa: E402
from sglang_reanchor.config import ReAnchorConfig  # noqa: E402
from sglang_reanchor.drafter.draft_vocab import top_tokens  # noqa: E402
from sglang_reanchor.engine.generator import SpeculativeGenerator  # noqa: E402
from sglang_reanchor.tree import build_draft_tree  # noqa: E402


def record_rounds(generator: SpeculativeGenerator, prompts: list[list[int]], max_new: int):
    """Run DFlash's chain on each prompt; per round ``(baseline [W], logits [n, V'], target [n])``
    and the token ids of the logits' columns (None: the whole vocabulary)."""
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    original = round_module.branch_candidates

    def spy(baseline, logits, config, token_ids=None):
        seen.append((baseline[0].clone(), logits[0].float().clone(), token_ids))
        return original(baseline, logits, config, token_ids)

    rounds = []
    round_module.branch_candidates = spy
    try:
        for prompt in prompts:
            seen.clear()
            result = generator.generate(prompt, max_new, method="reanchor", trace=True)
            assert result.rounds is not None and len(result.rounds) == len(seen)
            out = result.tokens
            for trace, (baseline, logits, ids) in zip(result.rounds, seen):
                first = trace.seq_len - len(prompt)  # out[first] is the round's root (bonus)
                n = logits.shape[0]
                if first + n >= len(out):  # the target's continuation past the answer's end is unknown
                    continue
                target = torch.tensor(out[first + 1:first + 1 + n])
                chain = int((baseline[1:1 + n] == target).long().cumprod(0).sum()) + 1
                assert chain == trace.accept_length, "the rounds and the recorded drafts are misaligned"
                rounds.append((baseline, logits, target, ids))
    finally:
        round_module.branch_candidates = original
    return rounds


def bound_taus(rounds, ks: list[int]) -> dict[int, float]:
    """Mean top-K bound per K over ``rounds``."""
    out = {}
    for k in ks:
        taus = []
        for baseline, logits, target, ids in rounds:
            top = logits.topk(k, dim=-1).indices
            top = ids[top] if ids is not None else top
            if k >= 1:  # choice 0 is the baseline's draft (ties: the draft the engine made)
                top[:, 0] = baseline[1:1 + top.shape[0]]
            hit = (top == target[:, None]).any(-1).long()
            taus.append(int(hit.cumprod(0).sum()) + 1)
        out[k] = sum(taus) / len(taus)
    return out


def best_first_taus(rounds, widths: list[int], budgets: list[int], temperature: float) -> dict[tuple[int, int], tuple[float, float]]:
    """``(width, budget) -> (mean tau, mean nodes)`` of best-first trees over ``rounds`` (batched)."""
    baseline = torch.stack([r[0] for r in rounds])  # [R, W]
    logits = torch.stack([r[1] for r in rounds])  # [R, n, V']
    target = torch.stack([r[2] for r in rounds])  # [R, n]
    ids = rounds[0][3]
    n = logits.shape[1]
    out = {}
    for width in widths:
        for budget in budgets:
            config = ReAnchorConfig(offsets=(), branch_width=width, branch_rows=budget, branch_length=n,
                                    branch_shape="best_first", branch_temperature=temperature, node_budget=budget,
                                    max_depth=n)
            branches = branch_candidates(baseline, logits, config, ids)
            empty = baseline.new_zeros(baseline.shape[0], 0, baseline.shape[1])
            tree = build_draft_tree(baseline, empty, torch.zeros(0, dtype=torch.long),
                                    torch.zeros(baseline.shape[0], 0, dtype=torch.bool),
                                    torch.zeros(baseline.shape[0], 1, dtype=torch.long), config, branches=branches)
            want = torch.nn.functional.pad(target, (1, 0))  # depth 0: the root, always right
            right = (tree.tokens == want.gather(1, tree.depth.clamp(max=n))) | (tree.depth == 0)
            real = torch.arange(tree.tokens.shape[1]) < tree.num_nodes[:, None]
            on_path = ~(tree.ancestors & ~right[:, None, :]).any(-1) & real  # every node above is right
            tau = (tree.depth * on_path).amax(dim=1) + 1
            out[(width, budget)] = (tau.float().mean().item(), tree.num_nodes.float().mean().item())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None)
    p.add_argument("--drafter", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--datasets", nargs="*", default=["gsm8k", "humaneval", "mt-bench", "aime25"])
    p.add_argument("--dataset-file", action="append", default=[])
    p.add_argument("--prompts", action="append", default=[])
    p.add_argument("--limit", type=int, default=6)
    p.add_argument("--skip", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-depth", type=int, default=6)
    p.add_argument("--draft-vocab", type=int, default=8192, help="0: the whole vocabulary")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 5, 10])
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--budgets", type=int, nargs="+", default=[7, 12, 16, 20, 24, 32, 48, 64, 128])
    p.add_argument("--branch-temperatures", type=float, nargs="+", default=[1.0],
                   help="temperatures the best-first trees score the drafter's distributions at (a calibration)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)

    target, drafter, tokenizer, provenance = load_pair(args)
    vocab = None
    if args.draft_vocab:
        if drafter.vocab_ranking is None:
            raise SystemExit("--draft-vocab: the drafter folder has no draft_vocab.safetensors (pass 0)")
        vocab = top_tokens(drafter.vocab_ranking, args.draft_vocab, "the drafter's draft vocabulary")
    # the chain, with branching on so that every round hands its slot distributions to `branch_candidates`;
    # the budget (the chain's nodes) keeps the branch itself out of the tree
    config = ReAnchorConfig(offsets=(), branch_width=1, branch_rows=1, max_depth=args.max_depth,
                            node_budget=args.max_depth + 1)
    generator = SpeculativeGenerator(target, drafter, config, draft_vocab=vocab)
    prompts = []
    for sample in load_samples(args):
        messages = [*sample.history, {"role": "user", "content": sample.turns[0]}]
        prompts.append(list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                          return_dict=True)["input_ids"]))
    from tqdm import tqdm
    rounds = []
    for prompt in tqdm(prompts, desc="chain rounds", unit="prompt"):
        rounds += record_rounds(generator, [prompt], args.max_new_tokens)
    bound = bound_taus(rounds, args.ks)
    trees = {t: best_first_taus(rounds, args.widths, args.budgets, t) for t in args.branch_temperatures}
    chain = bound[1] if 1 in bound else float("nan")

    lines = [f"# Top-K bound and best-first trees ({len(rounds)} rounds of DFlash's chain, {len(prompts)} prompts)",
             "", f"drafter: {provenance or args.drafter}; depth {args.max_depth}; draft vocabulary "
             f"{args.draft_vocab or 'whole'}",
             "", "| top-K bound | " + " | ".join(f"K = {k}" for k in args.ks) + " |",
             "|---|" + "---|" * len(args.ks),
             "| tau (x chain) | " + " | ".join(f"{bound[k]:.2f} ({bound[k] / chain:.2f}x)" for k in args.ks) + " |",
             "", "| best-first tree: tau (x chain), mean nodes | " + " | ".join(f"{b} nodes" for b in args.budgets)
             + " |", "|---|" + "---|" * len(args.budgets)]
    for t, tree in trees.items():
        for w in args.widths:
            cells = [f"{tree[(w, b)][0]:.2f} ({tree[(w, b)][0] / chain:.2f}x), {tree[(w, b)][1]:.0f}"
                     for b in args.budgets]
            lines.append(f"| branch_width {w} (top {1 + w}), branch_temperature {t} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tree_bound.md").write_text(text)
    (args.out / "tree_bound.json").write_text(json.dumps({
        "argv": sys.argv[1:], "rounds": len(rounds), "prompts": len(prompts), "drafter": provenance,
        "bound": {str(k): v for k, v in bound.items()},
        "best_first": [{"width": w, "budget": b, "branch_temperature": temp, "tau": t, "nodes": nodes}
                       for temp, tree in trees.items() for (w, b), (t, nodes) in tree.items()],
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
