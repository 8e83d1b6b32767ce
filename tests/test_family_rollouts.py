"""Domino and DSpark rollouts: the batched heads equal a plain per-block restatement of
SGLang's rollouts (GRU and Markov steps written out by hand), on random heads and hidden
states, drafts, their probabilities and the scores branching reads; the first n drafts do not depend on n; the reduced draft vocabulary and a padded
LM head; `draft_blocks` rolls every block out from its own anchor.

(SGLang's own functions as the oracle: tests_sglang/test_drafter_families.py.)
"""

from __future__ import annotations

import torch
from factories import tiny_domino_drafter, tiny_dspark_drafter, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.drafter import DraftContextCache, DraftVocabHead, draft_blocks, draft_hidden

VOCAB, HIDDEN = 24, 16
TARGET = tiny_target("qwen3", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=2, num_heads=2, num_kv_heads=1, seed=7)
EMB, HEAD = TARGET.get_input_embeddings(), TARGET.get_output_embeddings()
NEG = float("-inf")


def _gru(x: torch.Tensor, h: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor) -> torch.Tensor:
    """One GRU step, PyTorch's gate order (r, z, n), no biases."""
    ir, iz, in_ = (w_ih @ x).chunk(3)
    hr, hz, hn = (w_hh @ h).chunk(3)
    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    new = torch.tanh(in_ + r * hn)
    return (1 - z) * new + z * h


def _allowed(token_ids: torch.Tensor | None) -> torch.Tensor:
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[torch.arange(VOCAB) if token_ids is None else token_ids] = True
    return allowed


def _top_prob(scores: torch.Tensor) -> float:
    return float(scores.detach().softmax(-1).max())


def domino_reference(drafter, hidden: torch.Tensor, anchor: int, n: int, pool: int,
                     token_ids: torch.Tensor | None = None) -> tuple[list[int], list[float], torch.Tensor]:
    """One block ``hidden [W, H]``: SGLang's domino_greedy_rollout restated (the pool as a mask),
    the probability of each draft over the scores it was chosen from, and those scores ``[n, V]``
    (``-inf`` for tokens outside the draft vocabulary or the pool)."""
    gru, proj = drafter.prefix_gru, drafter.embed_proj
    allowed = _allowed(token_ids)
    start = 0 if drafter.domino.shift_label else 1
    z = hidden[start:start + hidden.shape[0] - 1]
    base = (z @ HEAD.weight.T).masked_fill(~allowed, NEG)
    k = min(pool, int(allowed.sum()))
    keep = allowed.clone()
    if 0 < k < int(allowed.sum()) and z.shape[0] > 1:
        keep = torch.zeros(VOCAB, dtype=torch.bool)
        keep[base[1:].amax(0).topk(k).indices] = True
    tokens, probs, rows = [int(base[0].argmax())], [_top_prob(base[0])], [base[0]]
    h = torch.zeros(drafter.domino.gru_hidden_dim, dtype=hidden.dtype)
    for t in (anchor, tokens[0]):
        h = _gru(EMB.weight[t], h, gru.weight_ih_l0, gru.weight_hh_l0)
    for i in range(1, n):
        latent = torch.nn.functional.silu(proj[0].weight @ torch.cat([z[i], h]))
        scores = (base[i] + proj[2].weight @ latent).masked_fill(~keep, NEG)
        tokens.append(int(scores.argmax()))
        probs.append(_top_prob(scores))
        rows.append(scores)
        h = _gru(EMB.weight[tokens[-1]], h, gru.weight_ih_l0, gru.weight_hh_l0)
    return tokens, probs, torch.stack(rows).detach()


def dspark_reference(drafter, hidden: torch.Tensor, anchor: int, n: int,
                     token_ids: torch.Tensor | None = None) -> tuple[list[int], list[float], torch.Tensor]:
    """One block ``hidden [W, H]``: SGLang's draft_markov_block (greedy) restated, the
    probability of each draft, and the scores ``[n, V]`` it was the argmax of."""
    m, kind = drafter.markov_head, drafter.dspark.markov_head_type
    start = 0 if drafter.dspark.sample_from_anchor else 1
    hs = hidden[start:start + n]
    base = (hs @ HEAD.weight.T).masked_fill(~_allowed(token_ids), NEG)
    prev, state, tokens, probs, rows = anchor, torch.zeros(drafter.dspark.markov_rank, dtype=hidden.dtype), [], [], []
    for s in range(n):
        e = m.markov_w1.weight[prev]
        if kind == "vanilla":
            bias = m.markov_w2.weight @ e
        elif kind == "gated":
            gate = torch.sigmoid(m.gate_proj.weight @ torch.cat([hs[s], e]) + m.gate_proj.bias)
            bias = m.markov_w2.weight @ (gate * e)
        else:
            g, c, o = (m.joint_proj.weight @ torch.cat([state, e, hs[s]]) + m.joint_proj.bias).chunk(3)
            state = torch.sigmoid(g) * state + (1 - torch.sigmoid(g)) * torch.tanh(c)
            bias = m.markov_w2.weight @ torch.tanh(o)
        prev = int((base[s] + bias).argmax())
        tokens.append(prev)
        probs.append(_top_prob(base[s] + bias))
        rows.append(base[s] + bias)
    return tokens, probs, torch.stack(rows).detach()


FAMILY = st.one_of(
    st.tuples(st.just("domino"), st.booleans(), st.sampled_from([0, 1, 3, 2048])),
    st.tuples(st.just("dspark"), st.booleans(), st.sampled_from(["vanilla", "gated", "rnn"])))


def _drafter(family: tuple, block: int, seed: int):
    name, flag, option = family
    if name == "domino":
        drafter = tiny_domino_drafter(TARGET, block_size=block, seed=seed, shift_label=flag, gru_hidden_dim=5, emb_dim=7)
        drafter.head.candidate_pool_size = option
        return drafter, lambda h, a, n, ids=None: domino_reference(drafter, h, a, n, option, ids)
    drafter = tiny_dspark_drafter(TARGET, block_size=block, seed=seed, markov_head_type=option, markov_rank=3,
                                  sample_from_anchor=flag)
    return drafter, lambda h, a, n, ids=None: dspark_reference(drafter, h, a, n, ids)


@settings(max_examples=60, deadline=None)
@given(family=FAMILY, block=st.integers(2, 7), bs=st.integers(1, 3), rows=st.integers(1, 4),
       seed=st.integers(0, 10_000), data=st.data())
def test_batched_rollout_equals_the_per_block_reference(family, block, bs, rows, seed, data) -> None:
    drafter, reference = _drafter(family, block, seed)
    width = drafter.block_size
    n = data.draw(st.integers(1, width - 1))
    subset = data.draw(st.booleans())
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bs, rows, width, HIDDEN, generator=g, dtype=torch.float64)
    anchors = torch.randint(0, VOCAB, (bs, rows), generator=g)
    token_ids = torch.randperm(VOCAB, generator=g)[: data.draw(st.integers(2, VOCAB))] if subset else None
    head = HEAD if token_ids is None else DraftVocabHead(HEAD, token_ids)
    got = drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=head, num_drafts=n)
    assert got.shape == (bs, rows, n) and got.dtype == torch.long
    same, probs = drafter.head.rollout_with_probs(hidden, anchors, embed_tokens=EMB, lm_head=head, num_drafts=n)
    assert torch.equal(same, got) and probs.shape == (bs, rows, n) and probs.dtype == torch.float32
    # the first block's scores (what branching reads), over the head's columns
    also, also_probs, scores = drafter.head.rollout_with_scores(hidden, anchors, embed_tokens=EMB, lm_head=head,
                                                                num_drafts=n, with_probs=True)
    assert torch.equal(also, got) and torch.equal(also_probs, probs)
    columns = torch.arange(VOCAB) if token_ids is None else token_ids
    assert scores.shape == (bs, n, len(columns))
    for b in range(bs):
        for r in range(rows):
            tokens, p, s = reference(hidden[b, r], int(anchors[b, r]), n, token_ids)
            assert got[b, r].tolist() == tokens, (b, r)
            torch.testing.assert_close(probs[b, r], torch.tensor(p, dtype=torch.float32), rtol=1e-5, atol=1e-6)
            if r == 0:
                torch.testing.assert_close(scores[b].double(), s[:, columns])
    full = drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=head, num_drafts=width - 1)
    assert torch.equal(got, full[:, :, :n])  # the first n drafts do not depend on n


def test_heads_change_the_drafts() -> None:
    """Not vacuous: the corrections move the argmax of a good share of slots."""
    for family in (("domino", True, 0), ("domino", False, 3), ("dspark", True, "vanilla"), ("dspark", False, "rnn")):
        drafter, _ = _drafter(family, 8, 1)
        g = torch.Generator().manual_seed(0)
        hidden = torch.randn(4, 4, drafter.block_size, HIDDEN, generator=g, dtype=torch.float64)
        anchors = torch.randint(0, VOCAB, (4, 4), generator=g)
        got = drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=HEAD, num_drafts=7)
        start = 0 if family[1] else 1
        plain = HEAD(hidden[:, :, start:start + 7]).argmax(-1)
        assert (got != plain).float().mean() > 0.2, family


def test_every_token_as_draft_vocab_and_a_padded_head_change_nothing() -> None:
    g = torch.Generator().manual_seed(5)
    padded = torch.nn.Linear(HIDDEN, VOCAB + 8, bias=False).double()
    with torch.no_grad():
        padded.weight[:VOCAB] = HEAD.weight
        padded.weight[VOCAB:] = 100.0  # rows past the vocabulary would win every argmax
    for family in (("domino", True, 2048), ("domino", True, 4), ("dspark", True, "gated"), ("dspark", False, "vanilla")):
        drafter, _ = _drafter(family, 6, 3)
        hidden = torch.randn(2, 3, drafter.block_size, HIDDEN, generator=g, dtype=torch.float64)
        anchors = torch.randint(0, VOCAB, (2, 3), generator=g)
        full = drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=HEAD, num_drafts=5)
        every = DraftVocabHead(HEAD, torch.randperm(VOCAB, generator=g))
        assert torch.equal(drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=every, num_drafts=5), full)
        crop = drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=padded, num_drafts=5, vocab_size=VOCAB)
        assert torch.equal(crop, full)
        try:
            drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=padded, num_drafts=5)
        except ValueError as e:
            assert "vocab_size" in str(e)
        else:
            raise AssertionError("an uncropped padded head must be refused")


def test_dspark_confidence_is_sglangs_formula() -> None:
    drafter = tiny_dspark_drafter(TARGET, block_size=5, markov_rank=3)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 2, 5, HIDDEN, generator=g, dtype=torch.float64)
    anchors = torch.randint(0, VOCAB, (2, 2), generator=g)
    drafts = drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=HEAD, num_drafts=4)
    conf = drafter.head.confidence(hidden, anchors, drafts)
    assert conf.shape == (2, 2, 4) and conf.dtype == torch.float32 and ((conf >= 0) & (conf <= 1)).all()
    proj = drafter.confidence_head.proj
    for b in range(2):
        for r in range(2):
            prev = [int(anchors[b, r])] + drafts[b, r, :3].tolist()
            feats = torch.cat([hidden[b, r, :4], drafter.markov_head.markov_w1.weight[prev]], dim=-1)
            want = torch.sigmoid((feats @ proj.weight[0] + proj.bias[0]).float())
            torch.testing.assert_close(conf[b, r], want)


def test_draft_blocks_rolls_every_block_out_from_its_own_anchor() -> None:
    """draft_blocks = the drafter forward, then the family head on each block (baseline and shifted)."""
    ids = torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    for drafter in (tiny_domino_drafter(TARGET, block_size=6, seed=2), tiny_dspark_drafter(TARGET, block_size=6, seed=2)):
        with torch.no_grad():
            hs = TARGET(ids, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1] for i in drafter.target_layer_ids], dim=-1)
        cache = DraftContextCache()
        cache.append(drafter.project_context(feats[:, :8], torch.arange(8)[None]))
        anchors, positions = torch.tensor([[5, 6, 7]]), torch.tensor([[8, 9, 11]])
        visible = torch.tensor([[0, 1, 3]])
        with torch.no_grad():
            blocks = draft_blocks(drafter, cache, anchors, positions, feats[:, 8:], visible, EMB, HEAD, num_drafts=4)
            hidden = draft_hidden(drafter, cache, anchors, positions, feats[:, 8:], visible, EMB)
        assert torch.equal(blocks[:, :, 0], anchors)
        assert torch.equal(blocks[:, :, 1:], drafter.head.rollout(hidden, anchors, embed_tokens=EMB, lm_head=HEAD,
                                                                   num_drafts=4))
        for r in range(3):  # each block alone gives the same drafts
            alone = draft_blocks(drafter, cache, anchors[:, r:r + 1], positions[:, r:r + 1], feats[:, 8:],
                                 visible[:, r:r + 1], EMB, HEAD, num_drafts=4)
            assert torch.equal(alone[0, 0], blocks[0, r])


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 5), subset=st.booleans(), seed=st.integers(0, 1000))
def test_dflash_draft_probabilities_are_the_softmax_of_its_logits(n, subset, seed) -> None:
    """`ArgmaxHead.rollout_with_probs`: its drafts, and each one's softmax probability over the
    head's vocabulary (all tokens, or the reduced draft vocabulary)."""
    from sglang_reanchor.drafter.heads import ARGMAX_HEAD

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 3, 6, HIDDEN, generator=g, dtype=torch.float64)
    anchors = torch.randint(0, VOCAB, (2, 3), generator=g)
    token_ids = torch.randperm(VOCAB, generator=g)[:7] if subset else None
    head = HEAD if token_ids is None else DraftVocabHead(HEAD, token_ids)
    drafts, probs = ARGMAX_HEAD.rollout_with_probs(hidden, anchors, lm_head=head, num_drafts=n)
    assert torch.equal(drafts, ARGMAX_HEAD.rollout(hidden, anchors, lm_head=head, num_drafts=n))
    logits = (hidden[:, :, 1 : 1 + n] @ HEAD.weight.T).masked_fill(~_allowed(token_ids), NEG)
    torch.testing.assert_close(probs, logits.softmax(-1).amax(-1).float(), rtol=1e-5, atol=1e-6)
    assert torch.equal(drafts, logits.argmax(-1))
    same, _, scores = ARGMAX_HEAD.rollout_with_scores(hidden, anchors, lm_head=head, num_drafts=n)
    columns = torch.arange(VOCAB) if token_ids is None else token_ids
    assert torch.equal(same, drafts)
    torch.testing.assert_close(scores, (hidden[:, 0, 1 : 1 + n] @ HEAD.weight.T)[..., columns])
