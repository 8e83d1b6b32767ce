"""Masks and layouts for draft-tree verification and ReAnchor drafting; tree-attention kernels (pure torch + optional Triton).

Conventions (stated once, used by every module here)
----------------------------------------------------
**Draft tree.** One request's tree is a 1-D int64 tensor ``parents`` of length N: node 0
is the root (``parents[0] == -1``) and every parent precedes its child
(``0 <= parents[i] < i``). Nodes are numbered in this order everywhere: query rows,
mask columns, KV slots of the tree.

**Mask.** ``True`` = attend. A tree node attends to the request's whole committed
prefix (``P`` KV entries), to its ancestors and to itself, and to nothing else.

Example, ``parents = [-1, 0, 0, 1]`` (N = 4) with a prefix of ``P = 2`` tokens::

         p0 p1            ancestor_mask           FULL_MASK row (P = 2)
          |                  col: 0 1 2 3           p0 p1 | 0 1 2 3
          0 (root)       row 0  [ 1 0 0 0 ]   ->  [ 1  1  | 1 0 0 0 ]
         / \\             row 1  [ 1 1 0 0 ]   ->  [ 1  1  | 1 1 0 0 ]
        1   2            row 2  [ 1 0 1 0 ]   ->  [ 1  1  | 1 0 1 0 ]
        |                row 3  [ 1 1 0 1 ]   ->  [ 1  1  | 1 1 0 1 ]
        3

The same tree in every layout this package produces:

=============================  =====================================================
SGLang FULL_MASK (mode 0)      rows above, row-major, 4 x 6 = 24 bools; requests
                               concatenated (:func:`sglang_full_mask`)
SGLang QLEN_ONLY (mode 1)      the 4 x 4 ancestor block, 16 bools (prefix implied)
SGLang QLEN_ONLY_BITPACKING    one word per row, bit j = column j (node 0 = LSB),
(mode 2)                       uint8 for N <= 8 (uint16 <= 16, uint32 <= 32):
                               ``[0b0001, 0b0011, 0b0101, 0b1011] = [1, 3, 5, 11]``
FlashInfer ``custom_mask``     = FULL_MASK (flat bool, KV = prefix slots then tree)
FlashInfer packed (little)     each request's flat FULL_MASK bits packed LSB-first,
                               bit k -> byte k // 8, bit k % 8, segment starts on a
                               fresh byte: 24 bits -> ``[199, 115, 189]``;
                               ``mask_indptr`` = byte offsets ``[0, 3]``
=============================  =====================================================

Where the bit orders come from: :mod:`attention.packing` cites the SGLang and
FlashInfer sources they were matched against.

What uses what
--------------
**The engine and the SGLang worker use only the masks** (:mod:`attention.masks`):
:func:`padded_ancestor_mask` (``sglang_reanchor.tree``: the draft tree's ancestors),
:func:`multi_anchor_mask` (``sglang_reanchor.drafter``, ``sglang_reanchor.srt.layout``: the
ReAnchor drafter mask), :func:`full_mask` (``srt.layout``: SGLang's FULL_MASK of the drafter
window and the tree) and :func:`unpack_full_mask` (``srt.cpu_attention``: the
``reanchor_sdpa`` backend's padded mask). Their attention kernels are Hugging Face's (the
engine) and SGLang's or ``reanchor_sdpa`` (the worker), not this package's.

**Only the GPU check and the tests run the rest**: the tree-attention backends (the Triton
kernel, :mod:`attention.triton_tree`, and the torch reference, :mod:`attention.reference`),
their plan step (:mod:`attention.layout`), the FlashInfer planner
(:class:`FlashInferTreeAttention`, :mod:`attention.plan`), the other SGLang / FlashInfer mask
layouts and bit packing, and :mod:`attention.transformers_backend` (an HF model's attention
through these backends). ``scripts/gpu_check_attention.py`` and ``scripts/gpu_check.py`` check
the kernels against the reference; ``tests/test_attention_*.py`` check all of it.

Modules
-------
Imports go one way: ``packing`` <- ``masks`` <- ``plan`` <- ``flashinfer_planner``, and
``layout`` <- ``reference`` / ``triton_tree`` <- ``tree_attn`` <- ``transformers_backend``
(``layout`` imports only torch; ``triton_tree`` is imported lazily, by ``tree_attn``).

* :mod:`attention.masks`: :func:`ancestor_mask`, :func:`batched_ancestor_mask`,
  :func:`tree_depths`, :func:`sglang_full_mask`, :func:`sglang_qlen_only_mask`,
  :func:`sglang_qlen_only_bitpacked`, :func:`multi_anchor_mask`, :func:`full_mask` (any
  per-request mask behind a prefix, FULL_MASK layout), :func:`unpack_full_mask`,
  :func:`padded_ancestor_mask`.
* :mod:`attention.packing`: :func:`segment_packbits`, :func:`pack_rows_to_words`.
* :mod:`attention.plan`: :class:`TreeBatch` (trees, prefix lengths, KV slots) ->
  :func:`plan_tree_batch` -> :class:`TreePlan` (FlashInfer ``plan()`` arrays for page size 1).
* :mod:`attention.layout`, tree attention FlashInfer's way: :class:`TreeAttentionSpec` (one
  forward's indptrs, slots, mask, heads) -> :func:`plan_tree_attention` (validates, reads the
  host once) -> :class:`TreeAttentionLayout`; then per layer ``backend.run(layout, q, k_cache,
  v_cache)``, the one :class:`TreeAttentionBackend` signature, device work only.
* Backends: :class:`~attention.reference.TorchTreeAttention` and
  :class:`~attention.triton_tree.TritonTreeAttention` (imported only when asked for);
  :func:`get_backend` picks one by name; :func:`tree_attention` plans and runs in one call.
* :class:`FlashInferTreeAttention`: FlashInfer's own ``plan(batch)`` / ``run(q, k_cache,
  v_cache)`` on a :class:`TreeBatch`.

Triton and FlashInfer are imported only when used.
"""

from attention.flashinfer_planner import FlashInferTreeAttention
from attention.layout import TreeAttentionBackend, TreeAttentionLayout, TreeAttentionSpec, plan_tree_attention
from attention.masks import (
    ancestor_mask,
    batched_ancestor_mask,
    full_mask,
    multi_anchor_mask,
    padded_ancestor_mask,
    sglang_full_mask,
    sglang_qlen_only_bitpacked,
    sglang_qlen_only_mask,
    tree_depths,
    unpack_full_mask,
)
from attention.packing import pack_rows_to_words, segment_packbits
from attention.plan import TreeBatch, TreePlan, plan_tree_batch
from attention.reference import TorchTreeAttention
from attention.tree_attn import get_backend, tree_attention

__all__ = [
    "FlashInferTreeAttention",
    "TorchTreeAttention",
    "TreeAttentionBackend",
    "TreeAttentionLayout",
    "TreeAttentionSpec",
    "TreeBatch",
    "TreePlan",
    "ancestor_mask",
    "batched_ancestor_mask",
    "full_mask",
    "get_backend",
    "multi_anchor_mask",
    "padded_ancestor_mask",
    "pack_rows_to_words",
    "plan_tree_attention",
    "plan_tree_batch",
    "segment_packbits",
    "sglang_full_mask",
    "sglang_qlen_only_bitpacked",
    "sglang_qlen_only_mask",
    "tree_attention",
    "tree_depths",
    "unpack_full_mask",
]
