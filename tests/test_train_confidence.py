"""DSpark's confidence head: fitted on teacher-forced acceptance, measured as a verify-length
signal (`train.confidence`, ``train confidence``)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from factories import random_sequences, tiny_drafter, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.drafter import DFlashDrafter
from sglang_reanchor.drafter.draft_vocab import DraftVocabHead
from sglang_reanchor.train.__main__ import format_confidence_report
from sglang_reanchor.train.acceptance import block_states, draft_blocks, teacher_forced_acceptance
from sglang_reanchor.train.confidence import (
    SlotExamples,
    confidence_of,
    confidence_report,
    fit_confidence_head,
    roc_auc,
    slot_examples,
    verify_length_curve,
    with_confidence_head,
)
from sglang_reanchor.train.heads import with_dspark_head
from sglang_reanchor.train.loss import IGNORE, block_labels, sample_anchors

B = 8


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target("llama", num_layers=4)


def _dspark(target, kind: str = "gated", with_markov: bool = True, seed: int = 3) -> DFlashDrafter:
    backbone = tiny_drafter(target, block_size=B, target_layer_ids=[1, 2], seed=seed)
    drafter = with_dspark_head(backbone, markov_rank=4, markov_head_type=kind)
    with torch.no_grad():  # a head that is not zero, so its drafts differ from the backbone's
        drafter.markov_head.markov_w2.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(seed))
    with_confidence_head(drafter, with_markov)
    with torch.no_grad():
        drafter.confidence_head.proj.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed + 1))
    return drafter.eval()


@pytest.mark.parametrize(("kind", "with_markov", "reduced"),
                         [("gated", True, False), ("rnn", True, True), ("vanilla", False, False)])
def test_slot_examples_are_the_teacher_forced_rounds(target, kind, with_markov, reduced) -> None:
    """Per slot: the confidence is the head's on the true earlier tokens (`DSparkHead.confidence`
    with drafts = labels), the draft and whether it is right are the validation's where a round
    reaches the slot, and the acceptance lengths are `teacher_forced_acceptance`'s on the same anchors."""
    drafter = _dspark(target, kind, with_markov)
    data = random_sequences(target, 7, seed=5)
    groups = ["math", "stub", "other", "math", "stub", "other", "math"]
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    vocab = torch.tensor([3, 7, 8, 11, 4, 15, 20, 6, 9, 12, 13, 5, 21, 22, 30, 31]) if reduced else None
    head = lm_head if vocab is None else DraftVocabHead(lm_head, vocab)
    idx = list(range(len(data)))
    ex = slot_examples(drafter, embed, head, data, idx, groups, anchors_per_seq=4, max_offset=None, seed=9,
                       batch_seqs=8, head_ids=vocab)
    report = teacher_forced_acceptance(drafter, embed, head, data, idx, groups, anchors_per_seq=4, max_offset=None,
                                       seed=9, head_ids=vocab)
    assert torch.equal(ex.accepted + 1, report.lengths) and torch.equal(ex.sequence, report.sequence)
    assert ex.groups == report.groups and torch.equal(ex.reached[:, 1:], report.slot_hits[:, :-1])
    # the same anchors, rebuilt: the head's confidence on the true tokens, the validation's drafts
    ids, feats, lens, plens = data.batch(idx)
    anchors = sample_anchors(plens, lens, 4, torch.Generator().manual_seed(9), max_offset=None)
    labels = block_labels(ids, anchors, lens, drafter.block_size)
    with torch.no_grad():
        blocks, anchor_ids = block_states(drafter, embed, ids, feats, anchors)
        conf = drafter.head.confidence(blocks, anchor_ids, labels.clamp(min=0))[anchors >= 0]
    drafts = draft_blocks(drafter, embed, head, ids, feats, anchors, vocab, labels=labels)[anchors >= 0]
    valid = labels[anchors >= 0] != IGNORE
    assert torch.equal(ex.valid, valid)
    torch.testing.assert_close(confidence_of(drafter, ex)[valid], conf[valid], rtol=1e-5, atol=1e-6)
    assert torch.equal(ex.correct[ex.reached], (drafts == labels[anchors >= 0])[ex.reached])
    assert ((ex.draft_prob > 0) & (ex.draft_prob <= 1)).all()
    assert ex.features.shape[-1] == drafter.config.hidden_size + (4 if with_markov else 0)


def test_fit_recovers_a_planted_logistic_model(target) -> None:
    """On slots whose acceptance follows a known logistic model of the features, the fit's
    confidence ranks them as well as the true model does and points the same way."""
    drafter = _dspark(target)
    g = torch.Generator().manual_seed(0)
    r, n, f = 600, B - 1, drafter.config.hidden_size + 4
    x = torch.randn(r, n, f, generator=g)
    w = torch.randn(f, generator=g) / math.sqrt(f) * 3
    p = torch.sigmoid(x @ w - 0.5)
    correct = torch.rand(r, n, generator=g) < p
    valid = torch.ones(r, n, dtype=torch.bool)
    valid[:50, 5:] = False
    ex = SlotExamples(x, correct, valid, torch.rand(r, n, generator=g), torch.arange(r), ["math"] * r)
    out = fit_confidence_head(drafter, ex)
    assert out["slots"] == int(valid.sum()) and out["bce"] < math.log(2) - 0.1
    fitted = confidence_of(drafter, ex)
    assert roc_auc(fitted[valid], correct[valid]) > roc_auc(p[valid], correct[valid]) - 0.02
    learned = drafter.confidence_head.proj.weight.detach()[0].float()
    assert float(torch.nn.functional.cosine_similarity(learned, w, dim=0)) > 0.9
    with pytest.raises(ValueError, match="no valid slots"):
        fit_confidence_head(drafter, SlotExamples(x, correct, torch.zeros_like(valid), p, torch.arange(r), []))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=2, max_size=30))
def test_roc_auc_is_the_share_of_correctly_ordered_pairs(pairs) -> None:
    score = torch.tensor([float(s) for s, _ in pairs])
    label = torch.tensor([b for _, b in pairs])
    pos = [s for s, b in pairs if b]
    neg = [s for s, b in pairs if not b]
    if not pos or not neg:
        assert math.isnan(roc_auc(score, label))
        return
    brute = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(pos, neg))
    assert roc_auc(score, label) == pytest.approx(brute / (len(pos) * len(neg)))


def test_verify_length_curve_on_known_blocks() -> None:
    """Fixed caps cut the accepted drafts at the cap; a signal that knows which drafts are right
    verifies one draft past the accepted ones at most (none past them with min_depth 0) and
    accepts all of them; a threshold of 0 verifies every valid slot."""
    correct = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    valid = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    ex = SlotExamples(torch.zeros(4, 4, 1), correct, valid, torch.full((4, 4), 0.5), torch.arange(4), ["x"] * 4)
    assert ex.accepted.tolist() == [2, 0, 3, 1]
    oracle = correct.float()
    out = verify_length_curve(ex, {"oracle": oracle, "half": ex.draft_prob}, thresholds=(0.5, 0.0))
    fixed = out["fixed"]
    assert [f["accepted"] for f in fixed] == [0.75, 1.25, 1.5, 1.5]
    assert [f["verified"] for f in fixed] == [1.0, 2.0, 3.0, 3.75]
    at_half, at_zero = out["curves"]["oracle"]
    assert at_half["accepted"] == 1.5 and at_half["verified"] == 1.75  # depths 2, 1 (min), 3, 1
    assert at_zero["verified"] == 3.75 and at_zero["accepted"] == 1.5
    assert out["curves"]["half"][0]["verified"] == 1.0  # 0.5, then 0.25 < 0.5: one draft
    matched = out["matched"]["oracle"][2]  # cap 3: 3 verified, 1.5 accepted; the oracle reaches 1.5 at 1.75
    assert matched["accepted_gain"] == pytest.approx(0.0) and matched["verified_ratio"] == pytest.approx(1.75 / 3)
    no_min = verify_length_curve(ex, {"oracle": oracle}, thresholds=(0.5,), min_depth=0)
    assert no_min["curves"]["oracle"][0]["verified"] == 1.5


def test_confidence_report_writes_a_drafter_sglang_loads(target, tmp_path) -> None:
    """`confidence_report` (what ``train confidence`` runs): fits on one data set, measures on
    another; the folder it leads to loads with the head and ``enable_confidence_head: true``
    and gives the same confidences."""
    drafter = _dspark(target)
    with torch.no_grad():
        drafter.confidence_head.proj.weight.zero_()
    train, val = random_sequences(target, 12, seed=1), random_sequences(target, 6, seed=2)
    report = confidence_report(drafter, target.get_input_embeddings(), target.get_output_embeddings(),
                               (train, ["math"] * 12), (val, ["stub", "other"] * 3), sequences=10,
                               anchors_per_seq=3, max_offset=None)
    assert report["settings"]["sequences"] == 10 and report["fit"]["blocks"] > 0
    assert report["val"]["blocks"] == int(sum(min(3, int(p)) for p in val.offsets.diff() - val.prompt_lens))
    assert set(report["val"]["auc_reached"]) == {"confidence", "draft_prob"}
    assert float(drafter.confidence_head.proj.weight.detach().abs().sum()) > 0
    text = format_confidence_report(report)
    assert "AUC on reached slots" in text and len(text.splitlines()) == 2 + B - 1
    drafter.save_pretrained(tmp_path)
    loaded = DFlashDrafter.from_pretrained(tmp_path).eval()
    assert loaded.dspark.confidence_head and loaded.confidence_head is not None
    ex = slot_examples(loaded, target.get_input_embeddings(), target.get_output_embeddings(), val,
                       list(range(6)), ["x"] * 6, anchors_per_seq=3, max_offset=None)
    torch.testing.assert_close(confidence_of(loaded, ex), confidence_of(drafter, ex))


def test_slot_examples_refuse_what_they_cannot_score(target) -> None:
    drafter = with_dspark_head(tiny_drafter(target, block_size=B, target_layer_ids=[1, 2]), markov_rank=4)
    data = random_sequences(target, 2, seed=1)
    args = (target.get_input_embeddings(), target.get_output_embeddings(), data, [0, 1], ["x", "x"])
    with pytest.raises(ValueError, match="no confidence head"):
        slot_examples(drafter, *args)
    with pytest.raises(ValueError, match="belongs to a DSpark drafter"):
        with_confidence_head(tiny_drafter(target, block_size=B, target_layer_ids=[1, 2]))  # type: ignore[arg-type]
    with_confidence_head(drafter)
    with pytest.raises(ValueError, match="must have the same length"):
        slot_examples(drafter, *args[:4], ["x"])
