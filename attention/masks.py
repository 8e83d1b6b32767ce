"""Tree attention masks: ancestor closure, SGLang's three layouts, the ReAnchor drafter mask.

Everything here is pure torch and vectorised: the ancestor closure uses pointer
jumping (``ceil(log2(depth + 1))`` gather steps over the whole batch at once), and
the only Python loops run over the requests of a batch. Conventions (True = attend,
``parents`` as a 1-D LongTensor with ``parents[0] == -1`` and ``parents[i] < i``) are
stated with a drawn example in the package docstring (:mod:`attention`).

SGLang's layouts (``TreeMaskMode`` in ``sglang/kernels/ops/speculative/spec_tree.py``,
``sglang/srt/speculative/eagle_utils.py``):

* FULL_MASK (0): per request ``N x (prefix_len + N)`` bools, row-major, requests
  concatenated: :func:`sglang_full_mask`.
* QLEN_ONLY (1): per request ``N x N`` bools (prefix implied), concatenated:
  :func:`sglang_qlen_only_mask`.
* QLEN_ONLY_BITPACKING (2): one unsigned word per row: :func:`sglang_qlen_only_bitpacked`
  (bit order in :func:`attention.packing.pack_rows_to_words`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attention.packing import pack_rows_to_words

__all__ = [
    "ancestor_mask",
    "batched_ancestor_mask",
    "check_parents",
    "full_mask",
    "unpack_full_mask",
    "multi_anchor_mask",
    "padded_ancestor_mask",
    "sglang_full_mask",
    "sglang_qlen_only_bitpacked",
    "sglang_qlen_only_mask",
    "tree_depths",
]


# ----------------------------------------------------------------------------
# Validation and the shared pointer-jumping core
# ----------------------------------------------------------------------------


def check_parents(parents: Tensor, name: str = "parents") -> None:
    """Raise ``ValueError`` unless ``parents`` is a valid draft tree.

    Parameters
    ----------
    parents : Tensor
        ``[N]`` int64, ``N >= 1``; ``parents[0] == -1`` and ``0 <= parents[i] < i`` for
        ``i >= 1``.
    name : str
        Argument name used in the error message.
    """
    if not isinstance(parents, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(parents).__name__}")
    if parents.dtype != torch.int64 or parents.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int64 tensor, got {parents.dtype} {tuple(parents.shape)}")
    if parents.numel() == 0:
        raise ValueError(f"{name} must hold at least the root node")
    idx = torch.arange(parents.numel(), device=parents.device)
    ok_root = bool(parents[0] == -1)
    ok_rest = bool(((parents[1:] >= 0) & (parents[1:] < idx[1:])).all())
    if not (ok_root and ok_rest):
        raise ValueError(f"{name} must satisfy parents[0] == -1 and 0 <= parents[i] < i for i >= 1")


def _flatten_forest(parents: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Concatenate per-request trees into one forest with global node ids.

    Returns ``flat_parents`` ``[T]`` int64 (roots stay -1, others shifted by the
    request's node offset) and ``node_indptr`` ``[bs + 1]`` int64.
    """
    if len(parents) == 0:
        raise ValueError("parents must hold at least one tree")
    for b, p in enumerate(parents):
        check_parents(p, name=f"parents[{b}]")
    device = parents[0].device
    if any(p.device != device for p in parents):
        raise ValueError("all parents tensors must be on one device")
    sizes = torch.tensor([p.numel() for p in parents], dtype=torch.int64, device=device)
    node_indptr = torch.zeros(len(parents) + 1, dtype=torch.int64, device=device)
    node_indptr[1:] = torch.cumsum(sizes, 0)
    offsets = torch.repeat_interleave(node_indptr[:-1], sizes)  # [T]
    flat = torch.cat(list(parents))
    flat_parents = torch.where(flat >= 0, flat + offsets, flat)
    return flat_parents, node_indptr


def _ancestor_paths(flat_parents: Tensor, steps: int | None = None) -> Tensor:
    """Pointer jumping: ``paths[t, m]`` = the m-th ancestor of node t (m = 0 is t), or -1.

    ``flat_parents`` is ``[T]`` int64 of a forest whose parents precede their children.
    Returns ``[T, D]`` int64 with ``D`` a power of two ``> max depth``. Step k doubles
    the known path length L: ``paths[t, L + m] = paths[anc_L(t), m]``. With ``steps``
    (enough when ``2**steps`` exceeds every depth) it runs exactly that many doublings
    and never reads the device; else it stops when no ancestor is left (a sync a step).
    """
    num_nodes = flat_parents.numel()
    paths = torch.arange(num_nodes, device=flat_parents.device).unsqueeze(1)  # [T, 1]
    anc = flat_parents  # anc[t] = L-th ancestor of t, L = paths.shape[1]
    for _ in range(steps if steps is not None else num_nodes):
        if steps is None and not bool((anc >= 0).any()):
            break
        has = anc >= 0
        safe = anc.clamp(min=0)
        ext = torch.where(has.unsqueeze(1), paths[safe], -1)  # [T, L]: (L + m)-th ancestors
        paths = torch.cat([paths, ext], dim=1)  # [T, 2L]
        anc = torch.where(has, anc[safe], -1)  # 2L-th ancestor
    return paths


def _forest_ancestor_blocks(parents: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Ancestor closure of a batch, padded.

    Returns ``mask`` ``[bs, n_max, n_max]`` bool (padding False), ``num_nodes`` ``[bs]``
    int64, and ``depth`` ``[T]`` int64 (flat over the batch, root depth 0).
    """
    flat_parents, node_indptr = _flatten_forest(parents)
    paths = _ancestor_paths(flat_parents)  # [T, D] global ids
    num_nodes = node_indptr[1:] - node_indptr[:-1]
    bs, n_max = num_nodes.numel(), int(num_nodes.max())
    req = torch.repeat_interleave(torch.arange(bs, device=paths.device), num_nodes)  # [T]
    local_row = torch.arange(paths.shape[0], device=paths.device) - node_indptr[req]  # [T]
    valid = paths >= 0
    depth = valid.sum(dim=1) - 1
    rows = local_row.unsqueeze(1).expand_as(paths)[valid]
    reqs = req.unsqueeze(1).expand_as(paths)[valid]
    cols = paths[valid] - node_indptr[reqs]
    mask = torch.zeros(bs, n_max, n_max, dtype=torch.bool, device=paths.device)
    mask[reqs, rows, cols] = True
    return mask, num_nodes, depth


# ----------------------------------------------------------------------------
# Ancestor closure
# ----------------------------------------------------------------------------


def ancestor_mask(parents: Tensor) -> Tensor:
    """Ancestor-or-self mask of one draft tree.

    Parameters
    ----------
    parents : Tensor
        ``[N]`` int64; ``parents[0] == -1``, ``0 <= parents[i] < i``.

    Returns
    -------
    Tensor
        ``[N, N]`` bool; ``out[i, j]`` is True iff node j is node i or an ancestor of i.

    Examples
    --------
    >>> ancestor_mask(torch.tensor([-1, 0, 0, 1])).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 0, 1, 0],
            [1, 1, 0, 1]], dtype=torch.int32)
    """
    mask, _, _ = _forest_ancestor_blocks([parents])
    return mask[0]


def batched_ancestor_mask(parents: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Ancestor-or-self masks of a batch of trees, zero padded to the largest tree.

    Parameters
    ----------
    parents : sequence of Tensor
        ``bs`` trees, each ``[N_b]`` int64 (conventions of :func:`ancestor_mask`).

    Returns
    -------
    mask : Tensor
        ``[bs, n_max, n_max]`` bool, ``n_max = max_b N_b``; rows and columns past
        ``N_b`` are False.
    num_nodes : Tensor
        ``[bs]`` int64, ``N_b``.
    """
    mask, num_nodes, _ = _forest_ancestor_blocks(parents)
    return mask, num_nodes


def padded_ancestor_mask(parents: Tensor) -> Tensor:
    """Ancestor-or-self masks of a padded batch of trees (`sglang_reanchor.tree.DraftTree`).

    Parameters
    ----------
    parents : Tensor
        ``[bs, N]`` int64: node 0 of each row is a root (-1); a later node is either a
        tree node (``0 <= parents[b, i] < i``) or padding (-1). Not validated: the
        core builds these, and checking would sync with the device every round.

    Returns
    -------
    Tensor
        ``[bs, N, N]`` bool: ``[b, i, j]`` is True iff ``j`` is ``i`` or an ancestor of
        ``i``. A padding node sees only itself (it is a root of its own).

    >>> padded_ancestor_mask(torch.tensor([[-1, 0, 1], [-1, 0, -1]])).int().tolist()
    [[[1, 0, 0], [1, 1, 0], [1, 1, 1]], [[1, 0, 0], [1, 1, 0], [0, 0, 1]]]
    """
    bs, n = parents.shape
    base = torch.arange(bs, device=parents.device)[:, None] * n
    flat_parents = torch.where(parents >= 0, parents + base, -1).reshape(-1)  # one forest, global ids
    paths = _ancestor_paths(flat_parents, steps=max(1, (n - 1).bit_length()))  # [bs * N, D]; depth < N
    cols = torch.where(paths >= 0, paths % n, n)  # missing ancestors go to a spare column
    mask = torch.zeros(bs * n, n + 1, dtype=torch.bool, device=parents.device)
    return mask.scatter_(1, cols, True)[:, :n].view(bs, n, n)


def tree_depths(parents: Sequence[Tensor]) -> Tensor:
    """Depth of every node of a batch (root 0), flat over the batch.

    Parameters
    ----------
    parents : sequence of Tensor
        ``bs`` trees, each ``[N_b]`` int64.

    Returns
    -------
    Tensor
        ``[sum_b N_b]`` int64. Verify positions are ``prefix_len[b] + depth``.

    Examples
    --------
    >>> tree_depths([torch.tensor([-1, 0, 0, 1]), torch.tensor([-1])])
    tensor([0, 1, 1, 2, 0])
    """
    _, _, depth = _forest_ancestor_blocks(parents)
    return depth


# ----------------------------------------------------------------------------
# SGLang layouts
# ----------------------------------------------------------------------------


def _as_prefix_lens(prefix_lens: Sequence[int] | Tensor, bs: int) -> list[int]:
    if isinstance(prefix_lens, Tensor):
        if prefix_lens.dim() != 1 or prefix_lens.dtype.is_floating_point or prefix_lens.dtype == torch.bool:
            raise ValueError(f"prefix_lens must be a 1-D integer tensor, got {prefix_lens.dtype}")
        lens = [int(x) for x in prefix_lens.tolist()]
    else:
        lens = [int(x) for x in prefix_lens]
    if len(lens) != bs:
        raise ValueError(f"prefix_lens has {len(lens)} entries, parents has {bs} trees")
    if any(x < 0 for x in lens):
        raise ValueError("prefix_lens must be >= 0")
    return lens


def sglang_full_mask(parents: Sequence[Tensor], prefix_lens: Sequence[int] | Tensor) -> Tensor:
    """SGLang ``TreeMaskMode.FULL_MASK``: ``[prefix ones | ancestor block]`` rows, flat.

    Parameters
    ----------
    parents : sequence of Tensor
        ``bs`` trees, each ``[N_b]`` int64.
    prefix_lens : sequence of int or Tensor
        ``[bs]``, committed prefix length ``P_b`` (the KV entries before the tree).

    Returns
    -------
    Tensor
        ``[sum_b N_b * (P_b + N_b)]`` bool on the device of ``parents``. Request b's
        block starts at ``sum_{c<b} N_c * (P_c + N_c)`` and is the row-major
        ``[N_b, P_b + N_b]`` matrix whose row i is ``P_b`` Trues then row i of
        :func:`ancestor_mask`. This is also FlashInfer's flat ``custom_mask`` for KV
        ``[prefix slots | tree slots]``.

    Examples
    --------
    >>> sglang_full_mask([torch.tensor([-1, 0, 0, 1])], [2]).view(4, 6).int()
    tensor([[1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 0, 1, 0],
            [1, 1, 1, 1, 0, 1]], dtype=torch.int32)
    """
    blocks, num_nodes = batched_ancestor_mask(parents)
    lens = torch.tensor(_as_prefix_lens(prefix_lens, len(parents)), dtype=torch.int64, device=blocks.device)
    return full_mask(blocks, lens, rows=num_nodes, cols=num_nodes)


def full_mask(tail: Tensor, prefix_lens: Tensor, rows: Tensor | None = None,
              cols: Tensor | None = None, max_prefix: int | None = None,
              prefix_sum: int | None = None) -> Tensor:
    """The FULL_MASK layout of any per-request mask after a committed prefix, flat.

    Request ``b``'s block is the row-major ``[r_b, P_b + c_b]`` matrix whose row ``i``
    is ``P_b`` Trues (the committed KV) then ``tail[b, i, :c_b]``; blocks are
    concatenated. `sglang_full_mask` is this with the ancestor mask as the tail; the
    ReAnchor draft window (`sglang_reanchor.srt.layout`) uses it with the
    `multi_anchor_mask` of its blocks.

    Parameters
    ----------
    tail : Tensor
        ``[bs, Q, K]`` bool, the mask among the new keys.
    prefix_lens : Tensor
        ``[bs]`` int64, ``P_b >= 0``, on the device of ``tail``.
    rows, cols : Tensor or None
        ``[bs]`` int64, ``r_b <= Q`` and ``c_b <= K`` (ragged requests); None: all.
    max_prefix : int or None
        ``max_b P_b`` when the caller knows it on the host; None reads it from
        ``prefix_lens`` (a device sync).
    prefix_sum : int or None
        ``sum_b P_b`` from the host (SGLang's ``seq_lens_cpu``), with ``max_prefix``,
        for full rows and columns (``rows`` and ``cols`` None). Then the output size
        is a host number and every entry is written at an index computed on the
        device: no device read at all. Without them the ragged selection sizes its
        output on the device.

    Returns
    -------
    Tensor
        ``[sum_b r_b * (P_b + c_b)]`` bool, built for the whole batch at once.

    >>> tail = torch.tensor([[[True, False], [True, True]]])
    >>> full_mask(tail, torch.tensor([1])).view(2, 3).int().tolist()
    [[1, 1, 0], [1, 1, 1]]
    >>> torch.equal(full_mask(tail, torch.tensor([1]), max_prefix=1, prefix_sum=1),
    ...             full_mask(tail, torch.tensor([1])))
    True
    """
    bs, q, k = tail.shape
    dev = tail.device
    p = prefix_lens.to(device=dev, dtype=torch.int64)
    if prefix_sum is not None and max_prefix is not None and rows is None and cols is None:
        total = q * (prefix_sum + bs * k)  # host arithmetic
        if bs == 0 or q == 0 or total == 0:
            return torch.ones(total, dtype=torch.bool, device=dev)
        padded = max_prefix + k
        col = torch.arange(padded, device=dev)
        t = col[None, :] - p[:, None]  # [bs, W]: column of the tail (< 0: the prefix)
        if k:
            picked = tail.gather(2, t.clamp(0, k - 1)[:, None, :].expand(bs, q, -1))  # [bs, Q, W]
            values = torch.where((t >= 0)[:, None, :], picked, True)
        else:
            values = torch.ones(bs, q, padded, dtype=torch.bool, device=dev)
        width = p + k  # [bs]
        block = q * width
        start = torch.cumsum(block, 0) - block  # [bs]: each request's block
        index = start[:, None, None] + torch.arange(q, device=dev)[None, :, None] * width[:, None, None] + col
        index = torch.where(col[None, None, :] < width[:, None, None], index, total)  # padding: a spare entry
        out = torch.empty(total + 1, dtype=torch.bool, device=dev)
        return out.scatter_(0, index.reshape(-1), values.reshape(-1))[:total]
    r = torch.full((bs,), q, dtype=torch.int64, device=dev) if rows is None else rows.to(dev)
    c = torch.full((bs,), k, dtype=torch.int64, device=dev) if cols is None else cols.to(dev)
    width = p + c  # [bs]
    if bs == 0 or k == 0:
        return torch.ones(int((r * width).sum()), dtype=torch.bool, device=dev)
    padded = (max_prefix if max_prefix is not None else int(p.max())) + k
    col = torch.arange(padded, device=dev)  # padded columns
    t = col[None, :] - p[:, None]  # [bs, W]: column of the tail (< 0: the prefix)
    picked = tail.gather(2, t.clamp(0, k - 1)[:, None, :].expand(bs, q, -1))  # [bs, Q, W]
    values = torch.where((t >= 0)[:, None, :], picked, True)
    keep = (col[None, None, :] < width[:, None, None]) & (torch.arange(q, device=dev)[None, :, None] < r[:, None, None])
    return values[keep]  # row-major over (b, i, column): each request's block in turn


def unpack_full_mask(flat: Tensor, prefix_lens: Tensor, q: int, max_prefix: int) -> Tensor:
    """A batch's FULL_MASK (``q`` queries per request) as one padded ``[bs, q, max_prefix + q]`` tensor.

    The inverse of `full_mask` for square tails: column ``j < P_b`` of row ``i`` is
    request ``b``'s prefix column ``j``, columns ``P_b <= j < max_prefix`` are padding
    (False), and column ``max_prefix + t`` is its new key ``t``. This is the layout one
    batched attention call reads: the cached keys of every request gathered into
    ``max_prefix`` columns, then the queries' own keys.

    Parameters
    ----------
    flat : Tensor
        ``[sum_b q * (P_b + q)]``, bool or 0/1 integers (SGLang keeps it as uint8 or bool).
    prefix_lens : Tensor
        ``[bs]`` int64, ``0 <= P_b <= max_prefix``.
    q : int
        Queries per request (``draft_token_num``).
    max_prefix : int
        ``max_b P_b`` or more, known on the host.

    >>> flat = full_mask(torch.tensor([[[True, False], [True, True]]]), torch.tensor([1]))
    >>> unpack_full_mask(flat, torch.tensor([1]), 2, max_prefix=2).int().tolist()
    [[[1, 0, 1, 0], [1, 0, 1, 1]]]
    """
    bs, dev = prefix_lens.shape[0], flat.device
    p = prefix_lens.to(device=dev, dtype=torch.int64)
    if flat.numel() != int((q * (p + q)).sum()):
        raise ValueError(f"flat has {flat.numel()} entries; a FULL_MASK of {q} queries per request after "
                         f"prefixes {p.tolist()} has {int((q * (p + q)).sum())}")
    if flat.numel() == 0:
        return torch.zeros(bs, q, max_prefix + q, dtype=torch.bool, device=dev)
    width = p + q  # [bs]
    start = torch.cumsum(q * width, 0) - q * width  # [bs]: each request's block in ``flat``
    col = torch.arange(max_prefix + q, device=dev)
    # padded column -> the request's own column: prefix columns keep theirs, new keys follow P_b
    own = torch.where(col[None, :] < max_prefix, col[None, :], p[:, None] + col[None, :] - max_prefix)  # [bs, W]
    real = (col[None, :] >= max_prefix) | (col[None, :] < p[:, None])  # [bs, W]
    index = start[:, None, None] + torch.arange(q, device=dev)[None, :, None] * width[:, None, None] + own[:, None, :]
    picked = flat.reshape(-1)[index.clamp(0, flat.numel() - 1)].bool()  # [bs, q, W]
    return picked & real[:, None, :]


def sglang_qlen_only_mask(parents: Sequence[Tensor]) -> Tensor:
    """SGLang ``TreeMaskMode.QLEN_ONLY``: the ``N_b x N_b`` ancestor blocks, flat.

    Parameters
    ----------
    parents : sequence of Tensor
        ``bs`` trees, each ``[N_b]`` int64. SGLang uses one N for the whole batch;
        trees of different sizes are laid out back to back all the same.

    Returns
    -------
    Tensor
        ``[sum_b N_b * N_b]`` bool; the prefix (all True) is implied.
    """
    blocks, num_nodes = batched_ancestor_mask(parents)
    return torch.cat([blocks[b, :n, :n].flatten() for b, n in enumerate(num_nodes.tolist())])


def sglang_qlen_only_bitpacked(parents: Sequence[Tensor]) -> Tensor:
    """SGLang ``TreeMaskMode.QLEN_ONLY_BITPACKING``: one packed word per tree row.

    Parameters
    ----------
    parents : sequence of Tensor
        ``bs`` trees, each ``[N_b]`` int64, ``N_b <= 32``.

    Returns
    -------
    Tensor
        ``[sum_b N_b]`` with dtype uint8 if ``max N_b <= 8``, uint16 if ``<= 16``,
        uint32 if ``<= 32`` (SGLang sizes the word by ``num_draft_tokens`` the same way).
        Bit j (value ``1 << j``) of row i's word is column j of the ancestor mask:
        node 0 is the least significant bit; stored little-endian, so byte ``j // 8``
        of the word holds node j at bit ``j % 8``.

    Examples
    --------
    >>> sglang_qlen_only_bitpacked([torch.tensor([-1, 0, 0, 1])])
    tensor([ 1,  3,  5, 11], dtype=torch.uint8)
    """
    blocks, num_nodes = batched_ancestor_mask(parents)
    rows = torch.cat([blocks[b, :n, :] for b, n in enumerate(num_nodes.tolist())])  # [T, n_max]
    return pack_rows_to_words(rows)


# ----------------------------------------------------------------------------
# ReAnchor drafter mask
# ----------------------------------------------------------------------------


def multi_anchor_mask(context_length: int, extra_visible: Tensor, num_extra: int, block_size: int) -> Tensor:
    """Drafter mask for R blocks drafted at once from different anchors (ReAnchor).

    Keys are ``[context (C) | extra context (X) | block_0 | ... | block_{R-1}]``;
    query rows are the R blocks of ``block_size`` (B) slots, block-major. Rows of
    block r see every context key, the first ``extra_visible[b, r]`` extra keys (the
    rejected-suffix context its anchor sits after), every key of their own block
    (bidirectional, as in DFlash), and no other block.

    Example: C = 2, X = 3, extra_visible = [[0, 2]], B = 2 (1 = attend)::

                    ctx   extra    blk0  blk1
                    c c   e e e    . .   . .
        blk0 row0 [ 1 1 | 0 0 0 |  1 1 | 0 0 ]
        blk0 row1 [ 1 1 | 0 0 0 |  1 1 | 0 0 ]
        blk1 row0 [ 1 1 | 1 1 0 |  0 0 | 1 1 ]
        blk1 row1 [ 1 1 | 1 1 0 |  0 0 | 1 1 ]

    Parameters
    ----------
    context_length : int
        ``C >= 0``, shared by the batch (the reference drafter's context cache). SGLang's
        draft window passes 0 and puts each request's own context in front with `full_mask`.
    extra_visible : Tensor
        ``[bs, R]`` int64 in ``[0, X]``; its device is the output's.
    num_extra : int
        ``X >= 0``.
    block_size : int
        ``B >= 1``.

    Returns
    -------
    Tensor
        ``[bs, R * B, C + X + R * B]`` bool, True = attend.

    >>> multi_anchor_mask(2, torch.tensor([[0, 2]]), 3, 2)[0].int()
    tensor([[1, 1, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 1, 1],
            [1, 1, 1, 1, 0, 0, 0, 1, 1]], dtype=torch.int32)
    """
    if context_length < 0 or num_extra < 0 or block_size < 1:
        raise ValueError(f"need context_length >= 0, num_extra >= 0, block_size >= 1; got "
                         f"{context_length}, {num_extra}, {block_size}")
    if not isinstance(extra_visible, Tensor) or extra_visible.dim() != 2 or extra_visible.dtype != torch.int64:
        raise ValueError("extra_visible must be a 2-D int64 tensor of shape [bs, R]")
    bs, num_blocks = extra_visible.shape
    dev = extra_visible.device
    q_block = torch.arange(num_blocks * block_size, device=dev) // block_size  # [R*B]
    committed = torch.ones(bs, num_blocks * block_size, context_length, dtype=torch.bool, device=dev)
    extra = torch.arange(num_extra, device=dev) < extra_visible[:, q_block, None]  # [bs, R*B, X]
    own = (q_block[:, None] == q_block[None, :]).expand(bs, -1, -1)  # [bs, R*B, R*B]
    return torch.cat([committed, extra, own], dim=-1)
