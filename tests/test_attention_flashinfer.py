"""FlashInfer tree-verify planner on a GPU (skipped without CUDA or flashinfer)."""

from __future__ import annotations

import pytest
import torch

from attention import FlashInferTreeAttention, TreeBatch
from attention import TorchTreeAttention, TreeAttentionSpec, plan_tree_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def random_batch(tree_sizes: list[int], prefix_lens: list[int], gen: torch.Generator) -> tuple[TreeBatch, int]:
    trees = [[-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)] for n in tree_sizes]
    total = sum(tree_sizes) + sum(prefix_lens)
    num_slots = total + 100
    perm = torch.randperm(num_slots, generator=gen)[:total].tolist()
    slots, cursor = [], 0
    for n, p in zip(tree_sizes, prefix_lens, strict=True):
        slots.append(perm[cursor : cursor + n + p])
        cursor += n + p
    return TreeBatch.from_lists(trees, prefix_lens, slots, device="cuda"), num_slots


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_flashinfer_planner_matches_torch_reference(dtype: torch.dtype) -> None:
    pytest.importorskip("flashinfer")
    gen = torch.Generator().manual_seed(0)
    batch, num_slots = random_batch([16, 1, 37, 64], [300, 0, 1025, 77], gen)
    num_q_heads, num_kv_heads, head_dim = 8, 2, 128
    runner = FlashInferTreeAttention(
        torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda"), num_q_heads, num_kv_heads, head_dim, dtype
    )
    plan = runner.plan(batch)
    q = torch.randn(int(plan.qo_indptr[-1]), num_q_heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(num_slots, num_kv_heads, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(num_slots, num_kv_heads, head_dim, device="cuda", dtype=dtype)
    got = runner.run(q, k, v)
    layout = plan_tree_attention(TreeAttentionSpec.from_tree_plan(plan, num_q_heads, num_kv_heads, head_dim))
    want = TorchTreeAttention().run(layout, q, k, v)
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
