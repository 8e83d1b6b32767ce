"""Training family heads (DSpark's Markov head, Domino's GRU correction) on a frozen DFlash backbone
(`train.heads`, ``fit --head-only``)."""

from __future__ import annotations

import pytest
import torch
from factories import random_sequences, tiny_domino_drafter, tiny_drafter, tiny_dspark_drafter, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.drafter import DFlashDrafter
from sglang_reanchor.drafter.domino import DominoDrafter
from sglang_reanchor.drafter.draft_vocab import DraftVocabHead
from sglang_reanchor.drafter.dspark import DSparkDrafter
from sglang_reanchor.engine import SpeculativeGenerator
from sglang_reanchor.train.acceptance import draft_blocks
from sglang_reanchor.train.heads import with_domino_head, with_dspark_head, with_head_of
from sglang_reanchor.train.loss import IGNORE
from sglang_reanchor.train.trainer import Trainer, TrainSettings, drafter_from_config, export

B = 8


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target("llama", num_layers=4)


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn", "domino"])
def test_a_new_head_drafts_what_its_backbone_drafts(target, tmp_path, kind) -> None:
    """`with_dspark_head` / `with_domino_head`: same backbone, DFlash's query layout, a zero
    correction: every round of ReAnchor decoding equals the backbone's; the folder loads back
    as that drafter."""
    backbone = tiny_drafter(target, block_size=B, target_layer_ids=[1, 2], seed=3)
    if kind == "domino":
        new: DFlashDrafter = with_domino_head(backbone, gru_hidden_dim=6, emb_dim=5, seed=1)
        assert type(new) is DominoDrafter and not new.domino.shift_label
        assert float(new.prefix_gru.weight_ih_l0.detach().abs().sum()) > 0  # only the output weight is zero
    else:
        new = with_dspark_head(backbone, markov_rank=4, markov_head_type=kind)
        assert type(new) is DSparkDrafter and new.gamma == B - 1
        assert not new.dspark.sample_from_anchor and new.confidence_head is None
    assert new.block_size == B
    prompt = [1, 5, 9, 4, 12, 7, 3]
    ours = SpeculativeGenerator(target, new).generate(prompt, 24, method="reanchor", trace=True)
    base = SpeculativeGenerator(target, backbone).generate(prompt, 24, method="reanchor", trace=True)
    assert ours.tokens == base.tokens and ours.acceptance_lengths == base.acceptance_lengths
    assert all(torch.equal(a.blocks, b.blocks) for a, b in zip(ours.rounds, base.rounds, strict=True))
    new.save_pretrained(tmp_path)
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert type(loaded) is type(new) and loaded.config_dict() == new.config_dict() and loaded.block_size == B


def test_with_dspark_head_refuses_what_it_cannot_build(target) -> None:
    with pytest.raises(ValueError, match="takes a DFlash drafter"):
        with_dspark_head(tiny_domino_drafter(target, target_layer_ids=[1, 2]), 4)
    with pytest.raises(ValueError, match="markov_head_type must be one of"):
        with_dspark_head(tiny_drafter(target, target_layer_ids=[1, 2]), 4, "lstm")
    with pytest.raises(ValueError, match="with_domino_head takes a DFlash drafter"):
        with_domino_head(tiny_dspark_drafter(target, target_layer_ids=[1, 2]))
    with pytest.raises(ValueError, match="gru_hidden_dim must be positive"):
        with_domino_head(tiny_drafter(target, target_layer_ids=[1, 2]), gru_hidden_dim=0)


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn", "domino"])
@settings(max_examples=6, deadline=None)
@given(reduced=st.booleans(), seed=st.integers(0, 50), cut=st.integers(0, B - 2))
def test_teacher_forced_family_drafts_equal_their_rollout(kind, reduced, seed, cut) -> None:
    """The validation's teacher-forced bias (a DSpark Markov head's, a Domino GRU's) is the
    rollout's: with labels equal to the head's own rollout except at slot ``cut``, every block's
    drafts equal the rollout's through ``cut`` (the slot the labels first differ at is still
    drafted from true previous tokens)."""
    target = tiny_target("llama", vocab_size=24, num_layers=3, seed=4)
    if kind == "domino":  # the candidate pool (2048) covers the whole vocabulary here: no pool
        drafter: DFlashDrafter = tiny_domino_drafter(target, block_size=B, target_layer_ids=[0, 1], seed=seed,
                                                     shift_label=False, gru_hidden_dim=6, emb_dim=7)
    else:
        drafter = tiny_dspark_drafter(target, block_size=B - 1, target_layer_ids=[0, 1], seed=seed,
                                      markov_head_type=kind, markov_rank=5, sample_from_anchor=False)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 24, (2, 20), generator=g)
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[1], hs[2]], -1)
    anchors = torch.tensor([[3, 9, 14], [5, 6, -1]])
    vocab = torch.tensor([3, 7, 8, 11, 4, 15, 20, 6, 9, 12, 13, 5, 21, 22]) if reduced else None
    lm_head = target.get_output_embeddings()
    head = lm_head if vocab is None else DraftVocabHead(lm_head, vocab)
    embed = target.get_input_embeddings()
    free = draft_blocks(drafter, embed, head, ids, feats, anchors, vocab)  # the rollout, [2, 3, B-1]
    live = anchors >= 0
    whole = draft_blocks(drafter, embed, head, ids, feats, anchors, vocab,
                         labels=torch.where(live[..., None], free, IGNORE))
    assert torch.equal(whole[live], free[live])  # labels = the rollout: every slot is reached and equal
    labels = free.clone()
    labels[:, :, cut] = torch.where(free[:, :, cut] == 3, 4, 3)  # differs from the draft at slot `cut`
    labels[anchors < 0] = IGNORE
    forced = draft_blocks(drafter, embed, head, ids, feats, anchors, vocab, labels=labels)
    assert torch.equal(forced[live][:, : cut + 1], free[live][:, : cut + 1])
    assert (forced[live][:, cut + 1:] == -1).all()  # not reached


@pytest.mark.parametrize("kind", ["gated", "domino"])
def test_a_trained_head_moves_onto_a_retrained_backbone(target, tmp_path, kind) -> None:
    """`with_head_of` (`train add-head --head-from`): the head's tensors kept, every backbone
    tensor the new backbone's; moving it back gives the original drafter; decoding with the
    moved drafter is lossless and drafts what the new backbone alone does not."""
    from sglang_reanchor.train.__main__ import main

    old = tiny_drafter(target, block_size=B, target_layer_ids=[1, 2], seed=3)
    headed = (with_domino_head(old, gru_hidden_dim=6, emb_dim=5, seed=1) if kind == "domino"
              else with_dspark_head(old, markov_rank=4, markov_head_type=kind))
    head = {k for k in headed.state_dict() if k not in old.state_dict()}
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # a head that is not zero (as if trained)
        torch.manual_seed(5)
        for name, p in headed.named_parameters():
            if name in head:
                p.normal_(0.0, 0.5)
    retrained = tiny_drafter(target, block_size=B, target_layer_ids=[1, 2], seed=4)
    retrained.vocab_ranking = torch.arange(3, 40).flip(0)
    moved = with_head_of(headed, retrained)
    assert type(moved) is type(headed) and moved.config_dict() == headed.config_dict()
    assert moved.vocab_ranking is retrained.vocab_ranking
    ours, theirs, before = moved.state_dict(), retrained.state_dict(), headed.state_dict()
    assert set(ours) == set(before) and head
    assert all(torch.equal(ours[k], before[k] if k in head else theirs[k]) for k in ours)
    back = with_head_of(moved, old).state_dict()
    assert all(torch.equal(back[k], v) for k, v in before.items())
    prompt = [1, 5, 9, 4, 12, 7, 3]
    expected = SpeculativeGenerator(target, retrained).generate(prompt, 24, method="target").tokens
    out = SpeculativeGenerator(target, moved).generate(prompt, 24, method="dflash", trace=True)
    base = SpeculativeGenerator(target, retrained).generate(prompt, 24, method="dflash", trace=True)
    assert out.tokens == expected
    assert any(not torch.equal(a.blocks, b.blocks) for a, b in zip(out.rounds, base.rounds))
    # the command line: a folder that loads back as the moved drafter
    headed.save_pretrained(tmp_path / "headed")
    retrained.save_pretrained(tmp_path / "retrained")
    main(["add-head", "--drafter", str(tmp_path / "retrained"), "--head-from", str(tmp_path / "headed"),
          "--out", str(tmp_path / "out")])
    loaded = DFlashDrafter.from_pretrained(tmp_path / "out", dtype=torch.float32).state_dict()
    assert all(torch.equal(loaded[k].float(), v.float()) for k, v in ours.items())


def test_with_head_of_refuses_what_it_cannot_move(target) -> None:
    old = tiny_drafter(target, block_size=B, target_layer_ids=[1, 2], seed=3)
    headed = with_dspark_head(old, markov_rank=4)
    with pytest.raises(ValueError, match="trains a DSpark or Domino drafter's head"):
        with_head_of(old, old)  # a DFlash drafter has no head to move
    with pytest.raises(ValueError, match="with_head_of takes a DFlash drafter"):
        with_head_of(headed, headed)
    with pytest.raises(ValueError, match="target_layer_ids"):
        with_head_of(headed, tiny_drafter(target, block_size=B, target_layer_ids=[0, 2], seed=3))
    with pytest.raises(ValueError, match="block_size"):
        with_head_of(headed, tiny_drafter(target, block_size=B + 2, target_layer_ids=[1, 2], seed=3))


@pytest.mark.parametrize("family", ["dspark", "domino"])
def test_a_head_only_run_trains_the_head_and_nothing_else(target, tmp_path, family) -> None:
    backbone = tiny_drafter(target, block_size=B, target_layer_ids=[1, 2], seed=1).train()
    backbone.vocab_ranking = torch.arange(3, 32).flip(0)
    data = random_sequences(target, 8, seed=2, dtype=torch.bfloat16)
    s = TrainSettings(lr=3e-2, warmup_steps=1, total_steps=12, batch_seqs=8, anchors_per_seq=6, gamma=2.0,
                      sample_slots=False, draft_vocab=20, autocast=False, head_only=True)
    with pytest.raises(ValueError, match="trains a DSpark or Domino drafter's head"):
        Trainer(target, backbone, data, s)
    if family == "dspark":
        drafter: DFlashDrafter = with_dspark_head(backbone, markov_rank=6, markov_head_type="gated").train()
        head_prefixes: tuple[str, ...] = ("markov_head.",)
        out_weight = "markov_head.markov_w2.weight"
    else:
        drafter = with_domino_head(backbone, gru_hidden_dim=8, emb_dim=6).train()
        head_prefixes, out_weight = ("prefix_gru.", "embed_proj."), "embed_proj.2.weight"
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    trainer = Trainer(target, drafter, data, s)
    batch = trainer.batch(0)
    with torch.no_grad():
        loss0, _ = trainer.loss_on(*batch)
    for _ in range(12):
        trainer.step()
    with torch.no_grad():
        loss1, _ = trainer.loss_on(*batch)
    after = drafter.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(head_prefixes) for k in changed)
    assert out_weight in changed
    assert float(loss1) < float(loss0) - 0.05  # the head learns the data's bigrams
    # checkpoints carry the family: resume and export rebuild a drafter of that family
    state = trainer.state_dict()
    assert type(drafter_from_config(state["config"])) is type(drafter)
    torch.save({**state, "labels_seen": 0}, tmp_path / "ckpt.pt")
    folder = export(tmp_path / "ckpt.pt", tmp_path / "out", dtype=torch.float32)
    loaded = DFlashDrafter.from_pretrained(folder)
    assert type(loaded) is type(drafter)
    assert torch.equal(loaded.state_dict()[out_weight], after[out_weight].float())
    assert torch.equal(loaded.vocab_ranking, backbone.vocab_ranking)
