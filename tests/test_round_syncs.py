"""The round core never waits for the device: zero host syncs, fixed shapes, no recompiles.

A CUDA graph replays a round only if the round reads nothing back from the device and
every shape is known before it runs; an overlap scheduler runs the host one round
ahead only if no step in between blocks. On a CPU nothing blocks, so these tests look
for what *would*: `SyncDetector` flags every scalar read, data-sized output and host
copy, and a strict ``torch.compile`` backend rejects unbacked symbols and scalar reads
across rounds that accept different lengths, with recompiles forbidden.

The drafter and the target are stand-ins (deterministic tensor functions of their
inputs and a per-round noise tensor, small vocabulary so drafts are often accepted):
they are not what is tested, only what feeds the core random acceptances.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from sglang_reanchor.audit import SyncDetector
from sglang_reanchor.bench.round_ops import DIM, MASK, StandInPair, count_round
from sglang_reanchor.config import ReAnchorConfig
from sglang_reanchor.round import CommitPlan, RoundCore
from sglang_reanchor.sampling import SamplingParams, sample_tokens
from sglang_reanchor.srt.layout import draft_window, verify_inputs
from sglang_reanchor.suffix import SuffixStore



def one_round(core: RoundCore, store: SuffixStore, pair: StandInPair, slots: Tensor, prefix: Tensor, bonus: Tensor,
              noise: Tensor, *, max_prefix: int, prefix_sum: int, budget: int,
              params: SamplingParams, gen: torch.Generator | None) -> tuple[CommitPlan, Tensor]:
    """The device part of a round, as the worker runs it (its draft window included), at a node budget."""
    suffix = store.gather(slots, prefix)
    anchors = core.anchors(bonus, prefix, suffix, fill_token=MASK)
    width = 1 + core.num_drafts
    window = draft_window(prefix, anchors, core.config.max_offset, width, MASK, max_prefix, prefix_sum)
    blocks = pair.draft(anchors.tokens, anchors.positions, width, noise)
    tree = core.tree(blocks, anchors, suffix, budget)
    vin = verify_inputs(tree, prefix, max_prefix, prefix_sum)
    logits, features = pair.verify(tree.tokens, vin.positions.view(tree.tokens.shape), noise)
    top1 = logits.argmax(-1)
    picks = top1 if params.greedy else sample_tokens(logits, params, gen)
    acc = core.accept(tree, picks, top1)
    plan = core.commit(tree, acc, prefix)
    store.put(slots, *core.next_suffix(acc, plan, features))
    return plan, acc.bonus + 0 * window.custom_mask.sum()  # the window's mask is part of the round


CASES = [  # (config, batch size, temperature)
    (ReAnchorConfig(), 1, 0.0),
    (ReAnchorConfig(), 4, 0.0),
    (ReAnchorConfig(), 16, 0.0),
    (ReAnchorConfig(offsets=()), 1, 0.0),  # DFlash's chain
    (ReAnchorConfig(offsets=()), 16, 1.0),
    (ReAnchorConfig(policy="offset", node_budget=12, max_depth=5), 4, 0.0),
    (ReAnchorConfig(policy="longest_prefix", fallback="offset", root_site=True), 4, 0.7),
    (ReAnchorConfig(policy="random", region="beyond"), 4, 0.0),
    (ReAnchorConfig(offsets=(1, 4), region="in_block", node_budget=20), 16, 1.0),
]


def _setup(config: ReAnchorConfig, bs: int, seed: int, num_drafts: int = 7):
    core = RoundCore(config, num_drafts, "cpu", generator=torch.Generator().manual_seed(seed))
    store = SuffixStore(bs + 3, config.max_offset, DIM)
    slots = torch.randperm(bs + 3, generator=torch.Generator().manual_seed(seed))[:bs]
    prefix_cpu = torch.randint(1, 30, (bs,), generator=torch.Generator().manual_seed(seed + 1))
    return core, store, StandInPair(seed), slots, prefix_cpu


@pytest.mark.parametrize("config,bs,temperature", CASES)
def test_a_round_makes_no_host_sync(config, bs, temperature):
    core, store, pair, slots, prefix_cpu = _setup(config, bs, seed=bs)
    params = SamplingParams(temperature=temperature)
    gen = torch.Generator().manual_seed(0)
    prefix, bonus = prefix_cpu.clone(), torch.zeros(bs, dtype=torch.long)
    taus: set[int] = set()
    for step in range(12):
        noise = torch.randint(0, 64, (bs,), generator=gen)
        host = dict(max_prefix=int(prefix_cpu.max()), prefix_sum=int(prefix_cpu.sum()))  # seq_lens_cpu
        with SyncDetector() as syncs:
            plan, bonus = one_round(core, store, pair, slots, prefix, bonus, noise, budget=config.node_budget,
                                    params=params, gen=gen, **host)
        syncs.assert_none()
        # the scheduler's part, after the round: the host learns the lengths
        prefix_cpu = prefix_cpu + plan.commit_lens
        prefix = plan.new_seq_lens
        taus.update(plan.commit_lens.tolist())
    assert len(taus) > 1  # the rounds accepted different lengths


def test_the_detector_sees_what_the_old_round_did():
    """The detector is not blind: the reads the round core removed are flagged."""
    x, index = torch.tensor([[1, 0, 2]]), torch.tensor([0])
    with SyncDetector() as syncs:
        int(x.max())
        _ = x[x > 0]
        _ = torch.tensor([1, 2, 3])
        x.tolist()
        torch.repeat_interleave(x[0], x[0])
        _ = x.nonzero()
    assert [h.op for h in syncs.hits] == [
        "aten._local_scalar_dense.default", "aten.index.Tensor", "torch.tensor", "Tensor.tolist",
        "aten.repeat_interleave.Tensor", "aten.nonzero.default"]
    assert all(h.where.startswith("test_round_syncs.py:") for h in syncs.hits)
    with SyncDetector() as syncs:
        torch.repeat_interleave(x[0], x[0], output_size=3)  # sized on the host: fine
        _ = x[index]
    syncs.assert_none()


def _strict_backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    """A ``torch.compile`` backend that refuses data-dependent shapes and scalar reads."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    banned = {"item", "tolist", "nonzero", "_local_scalar_dense", "masked_select", "unique", "bincount"}
    for node in gm.graph.nodes:
        name = getattr(node.target, "__name__", str(node.target)).split(".")[-1]
        if node.op in ("call_method", "call_function") and name in banned:
            raise AssertionError(f"scalar read or data-sized op in the round: {node.format_node()}")
        value = node.meta.get("example_value")
        values = value if isinstance(value, (tuple, list)) else [value]
        for v in values:
            if isinstance(v, torch.Tensor) and free_unbacked_symbols(v):
                raise AssertionError(f"data-dependent shape in the round: {node.format_node()}")
    return gm.forward


@pytest.mark.parametrize("config,bs", [(ReAnchorConfig(), 4), (ReAnchorConfig(offsets=()), 2),
                                       (ReAnchorConfig(policy="offset", max_depth=4, node_budget=10), 3)])
def test_a_round_compiles_to_one_static_graph(config, bs):
    torch._dynamo.reset()
    core, store, pair, slots, prefix_cpu = _setup(config, bs, seed=7)
    params = SamplingParams()
    host = dict(max_prefix=64, prefix_sum=0)  # fixed host bounds: the FULL_MASK of the window is not used here

    def device_round(prefix: Tensor, bonus: Tensor, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        suffix = store.gather(slots, prefix)
        anchors = core.anchors(bonus, prefix, suffix, fill_token=MASK)
        blocks = pair.draft(anchors.tokens, anchors.positions, 1 + core.num_drafts, noise)
        tree = core.tree(blocks, anchors, suffix)
        logits, features = pair.verify(tree.tokens, tree.positions(prefix), noise)
        top1 = logits.argmax(-1)
        acc = core.accept(tree, top1, top1)
        plan = core.commit(tree, acc, prefix)
        starts, lengths, tokens, predictions, feats = core.next_suffix(acc, plan, features)
        store.lengths[slots] = lengths.clamp(max=store.max_len)
        store.starts[slots] = starts
        store.tokens[slots] = tokens
        store.predictions[slots] = predictions
        store.features[slots] = feats
        return plan.new_seq_lens, acc.bonus, plan.commit_lens

    del host
    compiled = torch.compile(device_round, backend=_strict_backend, fullgraph=True, dynamic=False)
    gen = torch.Generator().manual_seed(3)
    prefix, bonus = prefix_cpu.clone(), torch.zeros(bs, dtype=torch.long)
    eager_prefix, eager_bonus = prefix.clone(), bonus.clone()
    taus: set[int] = set()
    for step in range(8):
        noise = torch.randint(0, 64, (bs,), generator=gen)
        if step == 1:
            torch.compiler.set_stance("fail_on_recompile")
        try:
            prefix, bonus, lens = compiled(prefix, bonus, noise)
        finally:
            torch.compiler.set_stance("default")
        taus.update(lens.tolist())
    assert len(taus) > 1  # different acceptances, one graph
    del eager_prefix, eager_bonus


def test_the_op_count_is_of_the_round_that_ran():
    """`bench round-ops` counts every step once, finds no sync, and sees the rounds accept."""
    row = count_round(ReAnchorConfig(), bs=4, rounds=8)
    assert row["syncs"] == [] and row["mean_tau"] > 1
    assert set(row["steps"]) == {"suffix gather", "anchors", "tree", "verify mask (FULL_MASK)", "accept",
                                 "commit plan", "suffix put"}
    assert 0 < row["core_kernel_ops"] <= row["core_ops"] < row["total_ops"]
