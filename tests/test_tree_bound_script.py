"""scripts/tree_bound.py on tiny random models: its rounds line up with the engine's, its top-K bound is the
chain's tau at K = 1, and a best-first tree big enough to hold every top-K path reaches the bound exactly."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from factories import tiny_drafter, tiny_target

from sglang_reanchor.config import ReAnchorConfig
from sglang_reanchor.engine.generator import SpeculativeGenerator

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tree_bound.py"


def load_script():
    spec = importlib.util.spec_from_file_location("tree_bound", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_best_first_trees_reach_the_top_k_bound():
    tb = load_script()
    target = tiny_target("llama", vocab_size=12, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, seed=2)
    target.generation_config.eos_token_id = target.config.eos_token_id = None
    depth = 3
    config = ReAnchorConfig(offsets=(), branch_width=1, branch_rows=1, max_depth=depth, node_budget=depth + 1)
    generator = SpeculativeGenerator(target, tiny_drafter(target, block_size=6, seed=4), config)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 12, (n,), generator=gen).tolist() for n in (3, 5, 8)]
    rounds = tb.record_rounds(generator, prompts, 24)  # asserts that chain acceptance = the engine's tau
    assert len(rounds) > 10
    bound = tb.bound_taus(rounds, [1, 2, 3, 12])
    assert bound[1] <= bound[2] <= bound[3] <= bound[12] == depth + 1  # every token is in the top 12
    assert bound[3] > bound[1]  # random drafters miss often: runner-ups matter
    everything = 1 + sum(3 ** d for d in range(1, depth + 1))  # every path over each slot's top 3
    trees = tb.best_first_taus(rounds, [1, 2], [depth + 1, everything], temperature=1.0)
    assert abs(trees[(1, depth + 1)][0] - bound[1]) < 1e-6  # no room past the chain: the chain
    assert abs(trees[(2, everything)][0] - bound[3]) < 1e-6 and trees[(2, everything)][1] == everything
    assert abs(trees[(1, everything)][0] - bound[2]) < 1e-6  # every top-2 path fits too
