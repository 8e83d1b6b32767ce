"""Domino and DSpark drafters against SGLang 0.5.23 itself (CPU, TP 1): SGLang's code is the oracle.

- A checkpoint this project writes loads in SGLang's own model classes
  (``DFlashDraftModel.load_weights`` for Domino, ``Qwen3DSparkModel.load_weights`` for
  DSpark) with the same weights, and one laid out the way SGLang's loaders accept it
  (``model.`` prefixes, the Domino fields at the top level, a DSpark folder's
  ``lm_head`` / ``embed_tokens`` tensors) loads in the project's loader.
- On the same drafter hidden states, `DominoHead.rollout` equals
  ``domino_utils.domino_greedy_rollout`` and `DSparkHead.rollout` equals the draft tokens
  of ``dspark_draft.draft_markov_block`` on the base logits of
  ``DSparkDraftMixin.compute_base_logits``, through SGLang's own padded
  ``ParallelLMHead`` and ``VocabParallelEmbedding`` (the seam the worker calls);
  DSpark's confidence equals ``DSparkDraftMixin.compute_confidence``.
- A broken config is refused by SGLang's parser and by the project's, naming the same field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_TARGET
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from factories import tiny_domino_drafter, tiny_dspark_drafter, tiny_target  # noqa: E402

from sglang_reanchor.drafter import (  # noqa: E402
    DFlashDrafter,
    DominoDrafter,
    DominoHead,
    DSparkDrafter,
    DSparkHead,
)

VOCAB, HIDDEN = 50, 32  # SGLang pads the LM head's rows to 64


@pytest.fixture(scope="module")
def sgl(tmp_path_factory):
    """A TP-1 SGLang context (groups on gloo) for building SGLang's draft models on a CPU;
    yields a namespace with a padded ParallelLMHead / VocabParallelEmbedding of a tiny target."""
    from types import SimpleNamespace

    from sglang.srt.plugins import load_plugins

    load_plugins()  # the project's CPU hooks (RoPE without vllm)
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from sglang.srt.runtime_context import SpawnRanks, create_context, use_context
    from sglang.srt.server_args import prepare_server_args

    root = tmp_path_factory.mktemp("sgl")
    (root / "target").mkdir()
    (root / "target" / "config.json").write_text(json.dumps(TINY_TARGET))
    args = prepare_server_args(["--model-path", str(root / "target"), "--device", "cpu"])
    with use_context(create_context(args, role="test", ranks=SpawnRanks(world_rank=0))):
        if not model_parallel_is_initialized():
            init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"file://{root}/init",
                                         local_rank=0, backend="gloo")
            initialize_model_parallel()
        from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        target = tiny_target("qwen3", vocab_size=VOCAB, hidden_size=HIDDEN, dtype=torch.float32)
        lm_head, embed = ParallelLMHead(VOCAB, HIDDEN), VocabParallelEmbedding(VOCAB, HIDDEN)
        lm_head.weight_loader(lm_head.weight, target.lm_head.weight.detach())
        embed.weight_loader(embed.weight, target.get_input_embeddings().weight.detach())
        assert lm_head.weight.shape[0] > VOCAB  # padded rows: the rollouts must crop them
        yield SimpleNamespace(target=target, lm_head=lm_head, embed=embed, root=root)


def sglang_model(folder: Path, cls_name: str):
    """SGLang's draft model class ``cls_name`` built from ``folder``'s config.json, weights loaded
    by its own ``load_weights``."""
    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.models.dspark import Qwen3DSparkModel
    from transformers import AutoConfig

    cls = {"DFlashDraftModel": DFlashDraftModel, "Qwen3DSparkModel": Qwen3DSparkModel}[cls_name]
    model = cls(AutoConfig.from_pretrained(folder))
    model.load_weights(iter(load_file(folder / "model.safetensors").items()))
    return model


def assert_same_weights(ours, theirs) -> None:
    """Every SGLang parameter equals ours (q/k/v and gate/up fused in SGLang's layers)."""
    mine = ours.state_dict()
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    for name, param in theirs.named_parameters():
        for big, parts in fused.items():
            if f".{big}." in name:
                want = torch.cat([mine[name.replace(big, p)] for p in parts])
                break
        else:
            want = mine[name]
        assert torch.equal(param.detach(), want.to(param.dtype)), name


def block_inputs(seed: int, rows: tuple[int, int], width: int):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*rows, width, HIDDEN, generator=g)
    return hidden, torch.randint(0, VOCAB, rows, generator=g)


@pytest.mark.parametrize("shift_label", [True, False])
@pytest.mark.parametrize("pool", [0, 3, 2048])
@pytest.mark.parametrize("block", [2, 6])
def test_domino_rollout_equals_sglangs(sgl, tmp_path, shift_label, pool, block):
    from sglang.srt.speculative.domino_utils import domino_greedy_rollout

    drafter = tiny_domino_drafter(sgl.target, block_size=block, shift_label=shift_label, seed=block)
    drafter.save_pretrained(tmp_path)
    theirs = sglang_model(tmp_path, "DFlashDraftModel")
    assert theirs.projector_type == "domino" and theirs.shift_label is shift_label
    ours = DFlashDrafter.from_pretrained(tmp_path)
    assert_same_weights(ours, theirs)
    ours.head.candidate_pool_size = pool
    for seed in range(3):
        hidden, anchors = block_inputs(seed, (2, 3), block)
        want = domino_greedy_rollout(
            draft_hidden=hidden.reshape(6, block, HIDDEN), bonus_tokens=anchors.reshape(6), target_embedding=sgl.embed,
            lm_head_weight=sgl.lm_head.weight, prefix_gru=theirs.prefix_gru, embed_proj=theirs.embed_proj,
            vocab_size=VOCAB, shift_label=shift_label, candidate_pool_size=pool, in_cuda_graph=False)
        for n in range(1, block):
            got = ours.head.rollout(hidden, anchors, embed_tokens=sgl.embed, lm_head=sgl.lm_head, num_drafts=n,
                                    vocab_size=VOCAB)
            assert torch.equal(got.reshape(6, n), want[:, :n]), (seed, n)
        # the same head over SGLang's own loaded modules (what the worker can call)
        over = DominoHead(theirs.prefix_gru, theirs.embed_proj, theirs.shift_label, pool)
        got = over.rollout(hidden, anchors, embed_tokens=sgl.embed, lm_head=sgl.lm_head, num_drafts=block - 1,
                           vocab_size=VOCAB)
        assert torch.equal(got.reshape(6, block - 1), want), seed


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("sample_from_anchor", [True, False])
@pytest.mark.parametrize("rows", [(1, 1), (2, 3)])  # one row: SGLang's fused greedy step for vanilla
def test_dspark_rollout_and_confidence_equal_sglangs(sgl, tmp_path, monkeypatch, kind, sample_from_anchor, rows):
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.dspark_components.dspark_draft import (
        DraftNoise,
        draft_markov_block,
        select_draft_hidden_without_anchor,
    )
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync

    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")  # SGLang builds the confidence head only then
    gamma = 5
    drafter = tiny_dspark_drafter(sgl.target, block_size=gamma, markov_head_type=kind, markov_rank=6,
                                  sample_from_anchor=sample_from_anchor, seed=len(kind))
    drafter.save_pretrained(tmp_path)
    theirs = sglang_model(tmp_path, "Qwen3DSparkModel")
    assert (theirs.gamma, theirs.sample_from_anchor) == (gamma, sample_from_anchor)
    assert theirs.confidence_head is not None
    ours = DFlashDrafter.from_pretrained(tmp_path)
    assert_same_weights(ours, theirs)
    theirs.attach_shared_modules(embed_tokens=sgl.embed, lm_head=sgl.lm_head)
    width, count = ours.block_size, rows[0] * rows[1]
    assert width == gamma + (0 if sample_from_anchor else 1)  # SGLang's query_token_num
    for seed in range(3):
        hidden, anchors = block_inputs(seed, rows, width)
        raw = hidden.reshape(count * width, HIDDEN)  # the draft forward's rows, as SGLang holds them
        if sample_from_anchor:
            model_hidden, hidden_3d = raw, raw.view(count, gamma, HIDDEN)
        else:
            model_hidden, hidden_3d = select_draft_hidden_without_anchor(raw, bs=count, gamma=gamma)
        base, features = theirs.compute_base_logits(model_hidden)
        want, _ = draft_markov_block(
            markov_head=theirs.markov_head, base_logits=base.view(count, gamma, -1), anchor_tokens=anchors.reshape(count),
            draft_hidden=hidden_3d, step_temperatures=torch.zeros(count),
            noise=DraftNoise(key=1, offset=torch.zeros(1, dtype=torch.int64)),
            tp_sync=SpecTpSync(get_parallel().tp_group), greedy_draft=True)
        for n in range(1, ours.head.max_drafts(width) + 1):
            got = ours.head.rollout(hidden, anchors, embed_tokens=sgl.embed, lm_head=sgl.lm_head, num_drafts=n,
                                    vocab_size=VOCAB)
            assert torch.equal(got.reshape(count, n), want[:, :n]), (seed, n)
        # the same head over SGLang's own loaded modules (what the worker can call)
        over = DSparkHead.over(theirs.markov_head, theirs.confidence_head, theirs.sample_from_anchor)
        assert over.markov_head.markov_w2.weight.data_ptr() == theirs.markov_head.markov_w2.weight.data_ptr()
        got = over.rollout(hidden, anchors, embed_tokens=sgl.embed, lm_head=sgl.lm_head, num_drafts=gamma - 1,
                           vocab_size=VOCAB)
        assert torch.equal(got.reshape(count, gamma - 1), want[:, : gamma - 1]), seed
        conf, _ = theirs.compute_confidence(anchor_tokens=anchors.reshape(count), draft_tokens=want,
                                            confidence_features=features)
        mine = ours.head.confidence(hidden, anchors, want.view(*rows, gamma))
        torch.testing.assert_close(mine.reshape(count, gamma), conf, rtol=1e-5, atol=1e-6)


def test_a_domino_checkpoint_laid_out_for_sglang_loads_here(sgl, tmp_path):
    """Top-level Domino fields (as the public checkpoints), "model."-prefixed tensors."""
    ref = tiny_domino_drafter(sgl.target, block_size=5, seed=3)
    cfg = ref.config_dict()
    nested = cfg["dflash_config"]
    for key in ("shift_label", "pure_draft_prefix_len", "gru_hidden_dim", "emb_dim"):
        cfg[key] = nested.pop(key)
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({f"model.{k}": v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "model.safetensors"))
    theirs = sglang_model(tmp_path, "DFlashDraftModel")
    ours = DFlashDrafter.from_pretrained(tmp_path)
    assert type(ours) is DominoDrafter and ours.domino == ref.domino
    assert_same_weights(ours, theirs)
    hidden, anchors = block_inputs(9, (2, 2), 5)
    from sglang.srt.speculative.domino_utils import domino_greedy_rollout

    want = domino_greedy_rollout(draft_hidden=hidden.reshape(4, 5, HIDDEN), bonus_tokens=anchors.reshape(4),
                                 target_embedding=sgl.embed, lm_head_weight=sgl.lm_head.weight,
                                 prefix_gru=theirs.prefix_gru, embed_proj=theirs.embed_proj, vocab_size=VOCAB,
                                 shift_label=True, candidate_pool_size=2048, in_cuda_graph=False)
    got = ours.head.rollout(hidden, anchors, embed_tokens=sgl.embed, lm_head=sgl.lm_head, num_drafts=4, vocab_size=VOCAB)
    assert torch.equal(got.reshape(4, 4), want)


def test_a_dspark_checkpoint_laid_out_for_sglang_loads_here(sgl, tmp_path):
    """Markov fields in dflash_config and at the top level, the target's lm_head / embed_tokens in
    the folder (SGLang skips them), no confidence tensors (SGLang's default builds no head)."""
    ref = tiny_dspark_drafter(sgl.target, block_size=4, markov_head_type="rnn", markov_rank=3, seed=4)
    cfg = ref.config_dict()
    cfg["dflash_config"].update(markov_rank=3, markov_head_type="rnn")
    del cfg["enable_confidence_head"], cfg["confidence_head_with_markov"], cfg["sample_from_anchor"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    state = {k: v.contiguous() for k, v in ref.state_dict().items() if not k.startswith("confidence_head.")}
    state["lm_head.weight"] = sgl.target.lm_head.weight.detach().clone()
    state["embed_tokens.weight"] = sgl.target.get_input_embeddings().weight.detach().clone()
    save_file(state, str(tmp_path / "model.safetensors"))
    theirs = sglang_model(tmp_path, "Qwen3DSparkModel")
    assert theirs.confidence_head is None  # SGLANG_RAGGED_VERIFY_MODE defaults to static
    ours = DFlashDrafter.from_pretrained(tmp_path)
    assert type(ours) is DSparkDrafter and ours.confidence_head is None and ours.dspark.sample_from_anchor
    assert_same_weights(ours, theirs)
    assert torch.equal(ours.markov_head.joint_proj.weight, ref.markov_head.joint_proj.weight)


# (a config change, the family's parser, the field both errors name)
BROKEN = [
    ("domino", {"dflash_config.shift_label": None}, "shift_label"),
    ("domino", {"dflash_config.shift_label": "true"}, "shift_label"),
    ("domino", {"dflash_config.pure_draft_prefix_len": 2}, "pure_draft_prefix_len=1"),
    ("domino", {"dflash_config.gru_hidden_dim": None}, "gru_hidden_dim"),
    ("domino", {"dflash_config.gru_hidden_dim": -1}, "gru_hidden_dim must be positive"),
    ("domino", {"dflash_config.emb_dim": None}, "emb_dim"),
    ("domino", {"emb_dim": 3}, "emb_dim differs"),
    ("dspark", {"markov_rank": None}, "markov_rank > 0"),
    ("dspark", {"markov_head_type": None}, "markov_head_type when markov_rank > 0"),
    ("dspark", {"markov_head_type": "lstm"}, "Unsupported DSpark markov_head_type='lstm'"),
    ("dspark", {"markov_rank": -2}, "markov_rank must be >= 0"),
]


def _sglang_parse(family: str, cfg: dict) -> None:
    """SGLang's own config checks for the family: the parser, then (DSpark) the model's head builder."""
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    if family == "domino":
        parse_dflash_draft_config(draft_hf_config=cfg)
        return
    from types import SimpleNamespace

    from sglang.srt.models.dspark import build_markov_head
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config

    parsed = parse_dspark_draft_config(draft_hf_config=cfg)
    if not parsed.require_markov():
        raise ValueError(f"DSpark draft requires markov_rank > 0, got markov_rank={parsed.markov_rank}.")
    build_markov_head(SimpleNamespace(**{k: v for k, v in cfg.items() if not isinstance(v, dict)}))


@pytest.mark.parametrize(("family", "change", "field"), BROKEN)
def test_sglang_and_the_project_refuse_the_same_configs(sgl, family, change, field):
    make = tiny_domino_drafter if family == "domino" else tiny_dspark_drafter
    cfg = make(sgl.target).config_dict()
    _sglang_parse(family, cfg)  # the unbroken config passes SGLang's checks
    for key, value in change.items():
        place, name = (cfg["dflash_config"], key.split(".", 1)[1]) if "." in key else (cfg, key)
        if value is None:
            place.pop(name, None)
        else:
            place[name] = value
    with pytest.raises(ValueError) as theirs:
        _sglang_parse(family, cfg)
    with pytest.raises(ValueError) as ours:
        (DominoDrafter if family == "domino" else DSparkDrafter)._from_raw(cfg)
    assert field in str(theirs.value) and field in str(ours.value), (str(theirs.value), str(ours.value))
