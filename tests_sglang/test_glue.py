"""The worker's glue on SGLang's own kernels and pool code (CPU; Triton under TRITON_INTERPRET=1).

- the tree's ``retrieve_*`` arrays drive SGLang's greedy tree-verify kernel to the
  same acceptance as the project's `accept_tree`;
- the verify FULL_MASK and the multi-anchor draft mask mean, inside SGLang's
  extend-attention kernel, what the reference engine's and the drafter's dense
  masks mean;
- the commit plan's KV moves, run by SGLang's ``move_kv_cache_native``, leave the
  accepted path at the front of the window;
- the per-slot suffix store survives batch filter/merge/reorder like a per-request
  dictionary does.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from sglang_reanchor import ReAnchorConfig, RejectedSuffix, SuffixStore
from sglang_reanchor.drafter import multi_anchor_mask
from sglang_reanchor.round import commit_plan, draft_anchors
from sglang_reanchor.srt.layout import cap_tree, draft_window, verify_inputs
from sglang_reanchor.suffix import SuffixBatch
from sglang_reanchor.tree import build_draft_tree
from sglang_reanchor.verify import accept_tree


def random_trees(gen: torch.Generator, bs: int, block: int, offsets: tuple[int, ...], vocab: int, policy: str):
    baseline = torch.randint(0, vocab, (bs, block), generator=gen)
    shifted = torch.randint(0, vocab, (bs, len(offsets), block), generator=gen)
    # make some anchors collide with baseline tokens so rows attach under "earliest"
    hit = torch.rand(bs, len(offsets), generator=gen) < 0.7
    site = torch.randint(1, block, (bs, len(offsets)), generator=gen)
    shifted[:, :, 0] = torch.where(hit, baseline.gather(1, site), shifted[:, :, 0])
    row_valid = torch.rand(bs, len(offsets), generator=gen) < 0.8
    rejected = torch.randint(0, vocab, (bs, max(offsets)), generator=gen)
    config = ReAnchorConfig(offsets=offsets, policy=policy, node_budget=int(torch.randint(8, 40, (1,), generator=gen)))
    return build_draft_tree(baseline, shifted, torch.tensor(offsets), row_valid, rejected, config)


def host(prefix_lens) -> dict:
    """The host numbers of a batch's committed lengths (SGLang's ``seq_lens_cpu``)."""
    p = torch.as_tensor(prefix_lens)
    return dict(max_prefix=int(p.max()), prefix_sum=int(p.sum()))


def accept_along_tree(gen: torch.Generator, tree, vocab: int) -> torch.Tensor:
    """Target picks that follow the tree for a random number of steps, then diverge."""
    picks = torch.randint(0, vocab, tree.tokens.shape, generator=gen)
    for b in range(tree.batch_size):
        node = 0
        for _ in range(int(torch.randint(0, 12, (1,), generator=gen))):
            children = [i for i in range(int(tree.num_nodes[b])) if int(tree.parents[b, i]) == node]
            if not children:
                break
            child = children[int(torch.randint(0, len(children), (1,), generator=gen))]
            picks[b, node] = tree.tokens[b, child]
            node = child
    return picks


@pytest.mark.parametrize("seed", range(12))
def test_retrieve_arrays_drive_sglang_greedy_tree_verify(seed):
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    gen = torch.Generator().manual_seed(seed)
    tree = random_trees(gen, bs=3, block=6, offsets=(1, 2, 3), vocab=5, policy=("earliest", "offset")[seed % 2])
    picks = accept_along_tree(gen, tree, vocab=5)
    acc = accept_tree(tree, picks, picks)

    bs, n = tree.tokens.shape
    index, next_token, next_sibling = tree.retrieve_arrays()
    depth = int(tree.depth.max()) + 1
    predicts = torch.full((bs * n,), -1, dtype=torch.long)
    accept_index = torch.full((bs, depth + 1), -1, dtype=torch.long)
    accept_num = torch.zeros(bs, dtype=torch.long)
    verify_tree_greedy_triton(predicts, accept_index, accept_num, tree.tokens.clone(),
                              index.clone(), next_token.clone(), next_sibling.clone(), picks.clone())
    assert (accept_num + 1).tolist() == acc.accept_lengths.tolist()
    for b in range(bs):
        t = int(acc.accept_lengths[b])
        assert accept_index[b, :t].tolist() == (b * n + acc.accepted_nodes[b, :t]).tolist()
        assert int(predicts[b * n + int(acc.accepted_nodes[b, t - 1])]) == int(acc.bonus[b])


def sglang_extend(q, k_new, v_new, k_prefix, v_prefix, prefix_lens, custom_mask, skip_prefix_mask):
    """SGLang's Triton extend attention over per-request prefixes plus ``Q`` new tokens each."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    bs, nq = len(prefix_lens), q.shape[0] // len(prefix_lens)
    heads, dim = q.shape[1], q.shape[2]
    total = sum(prefix_lens)
    k_buf = torch.zeros(total + 1, k_prefix[0].shape[1], dim)
    v_buf = torch.zeros_like(k_buf)
    k_buf[1:] = torch.cat(k_prefix) if total else k_buf[1:]
    v_buf[1:] = torch.cat(v_prefix) if total else v_buf[1:]
    kv_indices = torch.arange(1, total + 1, dtype=torch.int64)
    lens = torch.tensor(prefix_lens)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(lens, 0)
    qo_indptr = torch.arange(0, (bs + 1) * nq, nq, dtype=torch.int32)
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(nq * (lens + nq), 0)
    out = torch.zeros_like(q)
    extend_attention_fwd(q, k_new, v_new, out, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                         custom_mask, True, mask_indptr, nq, 1.0, 1.0, sm_scale=1.0 / math.sqrt(dim),
                         skip_prefix_custom_mask=skip_prefix_mask)
    return out


def dense(q, k, v, allowed):
    """Reference attention of one request: ``q [Q, H, D]``, ``k, v [K, Hkv, D]``, ``allowed [Q, K]``."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[2])
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def test_verify_mask_in_sglang_extend_kernel():
    gen = torch.Generator().manual_seed(0)
    tree = random_trees(gen, bs=2, block=6, offsets=(1, 2), vocab=4, policy="offset")
    bs, n = tree.tokens.shape
    prefix_lens = [5, 9]
    vin = verify_inputs(tree, torch.tensor(prefix_lens), **host(prefix_lens))
    heads, kv_heads, dim = 4, 2, 16
    q = torch.randn(bs * n, heads, dim, generator=gen)
    k_new, v_new = torch.randn(bs * n, kv_heads, dim, generator=gen), torch.randn(bs * n, kv_heads, dim, generator=gen)
    k_pre = [torch.randn(p, kv_heads, dim, generator=gen) for p in prefix_lens]
    v_pre = [torch.randn(p, kv_heads, dim, generator=gen) for p in prefix_lens]
    got = sglang_extend(q, k_new, v_new, k_pre, v_pre, prefix_lens, vin.custom_mask, skip_prefix_mask=True)
    anc = tree.ancestor_mask()
    for b, p in enumerate(prefix_lens):
        rows = slice(b * n, (b + 1) * n)
        allowed = torch.cat([torch.ones(n, p, dtype=torch.bool), anc[b]], 1)  # the reference engine's mask
        want = dense(q[rows], torch.cat([k_pre[b], k_new[rows]]), torch.cat([v_pre[b], v_new[rows]]), allowed)
        torch.testing.assert_close(got[rows], want, atol=1e-4, rtol=1e-4)


def test_draft_window_mask_needs_the_prefix_mask_in_sglang_extend_kernel():
    gen = torch.Generator().manual_seed(1)
    block, offsets = 4, (1, 2, 3)
    prefix = torch.tensor([6, 3])
    suffix = SuffixBatch(torch.tensor([3, 1]), torch.zeros(2, 3, dtype=torch.long),
                         torch.tensor([[8, 9, 10], [11, 12, 13]]), torch.zeros(2, 3, 1))
    anchors = draft_anchors(torch.tensor([5, 7]), prefix, suffix, torch.tensor(offsets), fill_token=0)
    win = draft_window(prefix, anchors, max(offsets), block, 0, **host(prefix))
    bs, nq = win.input_ids.shape
    extra = max(offsets)
    heads, kv_heads, dim = 2, 1, 16
    q = torch.randn(bs * nq, heads, dim, generator=gen)
    k_new, v_new = torch.randn(bs * nq, kv_heads, dim, generator=gen), torch.randn(bs * nq, kv_heads, dim, generator=gen)
    lens = win.seq_lens.tolist()  # committed + extra rows
    k_pre = [torch.randn(p, kv_heads, dim, generator=gen) for p in lens]
    v_pre = [torch.randn(p, kv_heads, dim, generator=gen) for p in lens]
    got = sglang_extend(q, k_new, v_new, k_pre, v_pre, lens, win.custom_mask, skip_prefix_mask=False)
    unhooked = sglang_extend(q, k_new, v_new, k_pre, v_pre, lens, win.custom_mask, skip_prefix_mask=True)
    d = torch.tensor(offsets)
    for b in range(bs):
        visible = torch.cat([torch.zeros(1, dtype=torch.long), torch.where(win.row_valid[b], d, 0)])[None]
        allowed = multi_anchor_mask(int(prefix[b]), visible, extra, block)[0]  # the reference drafter's mask
        rows = slice(b * nq, (b + 1) * nq)
        want = dense(q[rows], torch.cat([k_pre[b], k_new[rows]]), torch.cat([v_pre[b], v_new[rows]]), allowed)
        torch.testing.assert_close(got[rows], want, atol=1e-4, rtol=1e-4)
    # SGLang's default (prefix always visible) would let the baseline block see the rejected suffix
    assert not torch.allclose(got[:block], unhooked[:block], atol=1e-3)


@pytest.mark.parametrize("seed", range(6))
def test_commit_moves_with_sglang_move_kv_cache(seed):
    from sglang.srt.mem_cache.memory_pool import move_kv_cache_native

    gen = torch.Generator().manual_seed(seed)
    tree = random_trees(gen, bs=3, block=6, offsets=(1, 2, 3), vocab=4, policy="offset")
    picks = accept_along_tree(gen, tree, vocab=4)
    acc = accept_tree(tree, picks, picks)
    bs, n = tree.tokens.shape
    plan = commit_plan(tree, acc, torch.tensor([3, 0, 7]), stride=n)  # bs * N moves, identity ones included
    slots = torch.randperm(200, generator=gen)[: bs * n].view(bs, n) + 1  # the verify window in the pool
    k_buf = [torch.randn(202, 2, 8, generator=gen) for _ in range(2)]
    v_buf = [torch.randn(202, 2, 8, generator=gen) for _ in range(2)]
    before = [k.clone() for k in k_buf]
    window = slots.reshape(-1)
    move_kv_cache_native(k_buf, v_buf, window[plan.move_dst], window[plan.move_src])
    for b in range(bs):
        for k in range(int(acc.accept_lengths[b])):
            node = int(acc.accepted_nodes[b, k])
            for layer in range(2):
                assert torch.equal(k_buf[layer][slots[b, k]], before[layer][slots[b, node]])
    assert plan.out_tokens.shape == (bs, n) and plan.move_src.shape == (bs * n,)
    assert plan.new_seq_lens.tolist() == (torch.tensor([3, 0, 7]) + acc.accept_lengths).tolist()


def test_slot_store_follows_requests_through_filter_merge_and_reorder():
    rng = random.Random(0)
    dim, max_len, slots_total = 4, 3, 10
    store = SuffixStore(slots_total, max_len, dim)
    oracle: dict[str, RejectedSuffix] = {}  # keyed by request
    free = list(range(slots_total))
    running: dict[str, int] = {}  # request -> slot
    seq_len: dict[str, int] = {}
    for step in range(200):
        op = rng.random()
        if op < 0.2 and free:  # admit (prefill): a fresh slot, no suffix
            rid, slot = f"r{step}", free.pop(rng.randrange(len(free)))
            running[rid], seq_len[rid] = slot, rng.randrange(1, 50)
            store.reset(torch.tensor([slot]))
            oracle.pop(rid, None)
        elif op < 0.35 and running:  # finish / abort / retract: the request leaves the batch
            rid = rng.choice(sorted(running))
            free.append(running.pop(rid))
            oracle.pop(rid, None)
        elif running:  # a decode round over the running batch, in a scheduler-chosen order
            order = sorted(running)
            rng.shuffle(order)
            slots = torch.tensor([running[r] for r in order])
            prefix = torch.tensor([seq_len[r] for r in order])
            store.retain_only(slots)
            got = store.gather(slots, prefix)
            lengths, tokens, feats = got.lengths, got.tokens, got.features
            for i, rid in enumerate(order):
                want = oracle.get(rid)
                n = len(want) if want is not None and want.start == seq_len[rid] else 0
                assert int(lengths[i]) == n, (step, rid)
                if n:
                    assert tokens[i, :n].tolist() == want.tokens.tolist()
                    assert torch.equal(feats[i, :n], want.features)
            # the round commits some tokens and leaves new suffixes
            s = max_len + 2
            new_lens = torch.tensor([rng.randrange(0, s) for _ in order])
            new_tok = torch.randint(0, 9, (len(order), s))
            new_pred = torch.randint(0, 9, (len(order), s))
            new_feat = torch.randn(len(order), s, dim)
            for i, rid in enumerate(order):
                seq_len[rid] += rng.randrange(1, 5)
            starts = torch.tensor([seq_len[r] for r in order])
            store.put(slots, starts, new_lens, new_tok, new_pred, new_feat)
            for i, rid in enumerate(order):
                n = min(int(new_lens[i]), max_len)  # the store keeps at most max_len entries
                oracle[rid] = RejectedSuffix(start=seq_len[rid], tokens=new_tok[i, :n],
                                             predictions=new_pred[i, :n], features=new_feat[i, :n])


def test_a_stale_suffix_is_never_drafted_from():
    store = SuffixStore(4, 2, 3)
    store.put(torch.tensor([1]), torch.tensor([10]), torch.tensor([2]), torch.ones(1, 2, dtype=torch.long),
              torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, 3))
    assert store.gather(torch.tensor([1]), torch.tensor([10])).lengths.tolist() == [2]
    assert store.gather(torch.tensor([1]), torch.tensor([11])).lengths.tolist() == [0]  # another start: ignored
    store.retain_only(torch.tensor([0, 2]))
    assert store.get(1) is None and len(store) == 0


@pytest.mark.parametrize("seed", range(8))
def test_a_capped_tree_accepts_the_kept_part_of_the_full_path(seed):
    """Near the context end the worker verifies only the first nodes of each tree (`cap_tree`)."""
    gen = torch.Generator().manual_seed(seed)
    tree = random_trees(gen, bs=4, block=6, offsets=(1, 2, 3), vocab=4, policy=("earliest", "offset")[seed % 2])
    picks = accept_along_tree(gen, tree, vocab=4)
    full = accept_tree(tree, picks, picks)
    caps = torch.randint(1, tree.width + 1, (4,), generator=gen)
    capped = cap_tree(tree, caps, width=int(caps.max()))
    assert capped.width == min(tree.width, int(caps.max()))
    assert (capped.num_nodes == torch.minimum(tree.num_nodes, caps)).all()
    acc = accept_tree(capped, picks[:, : capped.width], picks[:, : capped.width])
    for b in range(4):
        path = full.accepted_nodes[b, : int(full.accept_lengths[b])].tolist()
        kept = [node for node in path if node < int(caps[b])]  # parents first: a prefix of the path
        assert kept == path[: len(kept)]
        assert acc.accepted_nodes[b, : int(acc.accept_lengths[b])].tolist() == kept
        assert int(acc.bonus[b]) == int(picks[b, kept[-1]])


def test_a_short_reservation_fails_before_any_write():
    """The worker's check (`context_end.check_reserved`), fed SGLang's record of a shrunk allocation."""
    from sglang_reanchor.srt.context_end import check_reserved, reserved_columns, round_room

    seq_lens = torch.tensor([20, 30])
    room = round_room(seq_lens, row_width=100, draft_columns=35, node_budget=16)
    reqs = [SimpleNamespace(rid="a", kv=SimpleNamespace(kv_allocated_len=20 + 70)),
            SimpleNamespace(rid="b", kv=SimpleNamespace(kv_allocated_len=30 + 35))]
    check_reserved(reserved_columns(reqs, seq_lens), room.writes, reqs)  # exactly enough
    reqs[1].kv.kv_allocated_len -= 1  # one slot short of the draft window
    with pytest.raises(RuntimeError, match="request 'b' has 34 KV slots reserved .* this round writes 35"):
        check_reserved(reserved_columns(reqs, seq_lens), room.writes, reqs)
