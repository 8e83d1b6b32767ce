"""DFlash drafter: config format, z-lab semantics, checkpoints, multi-anchor drafting."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from factories import tiny_drafter, tiny_target, write_zlab_drafter
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

from sglang_reanchor.drafter import (
    ContextKV,
    DFlashConfig,
    DFlashDrafter,
    DraftContextCache,
    build_target_layer_ids,
    draft_blocks,
    draft_hidden,
    multi_anchor_mask,
)

# The released z-lab/Qwen3-4B-DFlash-b16 config.json keys (notes/dflash.md §1), with the
# sizes scaled down: hidden 2560 -> 32, 5 layers -> 2, 32/8 heads of 128 -> 4/2 of 8.
QWEN3_4B_DFLASH_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "block_size": 16,
    "bos_token_id": 151643,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "dtype": "bfloat16",
    "eos_token_id": 151645,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "layer_types": ["full_attention", "full_attention"],
    "max_position_embeddings": 40960,
    "max_window_layers": 2,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_target_layers": 36,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "transformers_version": "4.57.3",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


# -- config ---------------------------------------------------------------------------


def _zlab_layer_ids(num_target: int, num_draft: int) -> list[int]:
    """z-lab's build_target_layer_ids, restated for targets of >= 5 layers."""
    if num_draft == 1:
        return [num_target // 2]
    span = num_target - 4
    return [int(round(1 + i * span / (num_draft - 1))) for i in range(num_draft)]


def test_build_target_layer_ids_matches_zlab() -> None:
    assert build_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    for num_target in range(5, 65):
        for num_draft in range(1, min(8, num_target - 3)):
            assert list(build_target_layer_ids(num_target, num_draft)) == _zlab_layer_ids(
                num_target, num_draft)


@given(num_target=st.integers(1, 80), num_draft=st.integers(1, 12))
@settings(max_examples=200, deadline=None)
def test_build_target_layer_ids_tiny_targets(num_target: int, num_draft: int) -> None:
    ids = build_target_layer_ids(num_target, num_draft)
    assert list(ids) == sorted(set(ids)) and 1 <= len(ids) <= num_draft
    assert 0 <= ids[0] and ids[-1] <= num_target - 1
    if num_target >= 2:  # the last layer's HF hidden state is post-final-norm
        assert ids[-1] < num_target - 1


def test_released_config_round_trips_unchanged() -> None:
    cfg = DFlashConfig.from_dict(QWEN3_4B_DFLASH_CONFIG)
    assert (cfg.block_size, cfg.mask_token_id, cfg.num_target_layers) == (16, 151669, 36)
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33) and cfg.rope_theta == 1e6
    assert cfg.num_context_features == 5 * 32 and cfg.torch_dtype is torch.bfloat16
    assert cfg.to_dict() == QWEN3_4B_DFLASH_CONFIG
    assert json.dumps(cfg.to_dict(), sort_keys=True) == json.dumps(QWEN3_4B_DFLASH_CONFIG, sort_keys=True)


def test_config_variants_round_trip() -> None:
    # transformers-5 style rope_parameters, block_size inside dflash_config (Qwen3.5 files)
    d = copy.deepcopy(QWEN3_4B_DFLASH_CONFIG)
    del d["rope_theta"], d["rope_scaling"], d["block_size"]
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000000}
    d["dflash_config"]["block_size"] = 8
    cfg = DFlashConfig.from_dict(d)
    assert cfg.rope_theta == 1e7 and cfg.block_size == 8
    assert cfg.to_dict() == d
    # an edited field is written where the file keeps it
    out = dataclasses.replace(cfg, block_size=4, rope_theta=5e5).to_dict()
    assert out["dflash_config"]["block_size"] == 4 and "block_size" not in out
    assert out["rope_parameters"]["rope_theta"] == 500000 and "rope_theta" not in out


def test_fresh_config_round_trips() -> None:
    cfg = DFlashConfig.for_target(tiny_target("qwen3").config, num_layers=2, mask_token_id=31)
    d = cfg.to_dict()
    assert d["architectures"] == ["DFlashDraftModel"] and d["model_type"] == "qwen3"
    assert d["dflash_config"] == {"mask_token_id": 31, "target_layer_ids": [1, 2]}
    assert d["block_size"] == 16 and d["num_target_layers"] == 4
    again = DFlashConfig.from_dict(d)
    assert again == cfg and again.to_dict() == d


def test_for_target_real_sizes() -> None:
    qwen3_4b = Qwen3Config(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                           num_key_value_heads=8, head_dim=128, intermediate_size=9728,
                           vocab_size=151936, max_position_embeddings=40960)
    cfg = DFlashConfig.for_target(qwen3_4b, num_layers=5, mask_token_id=151669)
    assert cfg.target_layer_ids == (1, 9, 17, 25, 33) and cfg.num_context_features == 12800
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.block_size) == (128, 8, 16)
    llama = tiny_target("llama").config
    cfg = DFlashConfig.for_target(llama, num_layers=1, mask_token_id=5, intermediate_size=48,
                                  target_layer_ids=[0, 3], block_size=4)
    assert cfg.target_layer_ids == (0, 3) and cfg.intermediate_size == 48
    assert cfg.tie_word_embeddings is False and cfg.head_dim == 8


@pytest.mark.parametrize(("change", "field"), [
    ({"block_size": 1}, "block_size"),
    ({"mask_token_id": -1}, "mask_token_id"),
    ({"mask_token_id": 151936}, "mask_token_id"),
    ({"target_layer_ids": []}, "target_layer_ids"),
    ({"target_layer_ids": [1, 36]}, "target_layer_ids"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"dtype": "int8"}, "dtype"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention", "linear_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding_window"),
    ({"hidden_size": 0}, "hidden_size"),
])
def test_config_validation_names_the_field(change: dict, field: str) -> None:
    cfg = DFlashConfig.from_dict(QWEN3_4B_DFLASH_CONFIG)
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(cfg, **change)


def test_config_from_dict_errors() -> None:
    d = copy.deepcopy(QWEN3_4B_DFLASH_CONFIG)
    d["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    with pytest.raises(ValueError, match="rope_type"):
        DFlashConfig.from_dict(d)
    d = copy.deepcopy(QWEN3_4B_DFLASH_CONFIG)
    del d["dflash_config"]["mask_token_id"], d["hidden_size"]
    with pytest.raises(ValueError, match=r"hidden_size.*mask_token_id"):
        DFlashConfig.from_dict(d)
    del d["dflash_config"]["target_layer_ids"]  # derived from num_target_layers, as z-lab
    d["hidden_size"], d["dflash_config"]["mask_token_id"] = 32, 7
    assert DFlashConfig.from_dict(d).target_layer_ids == (1, 33)


# -- model: names, z-lab semantics ------------------------------------------------------


def _zlab_names(num_layers: int) -> set[str]:
    per_layer = [f"self_attn.{p}_proj.weight" for p in "qkvo"] + [
        "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
        "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
        "post_attention_layernorm.weight"]
    return {f"layers.{i}.{n}" for i in range(num_layers) for n in per_layer} | {
        "fc.weight", "hidden_norm.weight", "norm.weight"}


def test_parameter_names_are_zlab() -> None:
    drafter = DFlashDrafter(DFlashConfig.from_dict(QWEN3_4B_DFLASH_CONFIG))
    state = drafter.state_dict()
    assert set(state) == _zlab_names(2) and len(state) == 2 * 11 + 3
    assert state["fc.weight"].shape == (32, 5 * 32)
    assert state["layers.0.self_attn.k_norm.weight"].shape == (8,)
    assert "rotary_emb.inv_freq" in dict(drafter.named_buffers())


def test_inv_freq_stays_float32() -> None:
    drafter = tiny_drafter(tiny_target("qwen3")).to(torch.bfloat16)
    inv = drafter.rotary_emb.inv_freq
    assert inv.dtype == torch.float32
    assert torch.equal(inv, drafter.rotary_emb.compute_inv_freq())


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def zlab_forward(drafter: DFlashDrafter, target_hidden: torch.Tensor, noise: torch.Tensor,
                 position_ids: torch.Tensor) -> torch.Tensor:
    """z-lab ``DFlashDraftModel.forward`` restated with HF Qwen3 RoPE and eager attention.

    target_hidden [bs, S, K*H], noise [bs, B, H], position_ids [bs, S+B]; no cache.
    """
    c, w = drafter.config, dict(drafter.named_parameters())
    hf = Qwen3Config(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                     head_dim=c.head_dim, rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta})
    cos, sin = Qwen3RotaryEmbedding(hf)(noise, position_ids)
    bs, q_len, _ = noise.shape
    ctx = _rms(target_hidden @ w["fc.weight"].T, w["hidden_norm.weight"], c.rms_norm_eps)
    h, groups = noise, c.num_attention_heads // c.num_key_value_heads
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."

        def lin(x: torch.Tensor, name: str, p: str = p) -> torch.Tensor:
            b = w.get(p + name + ".bias")
            return x @ w[p + name + ".weight"].T + (0 if b is None else b)

        x = _rms(h, w[p + "input_layernorm.weight"], c.rms_norm_eps)
        q = _rms(lin(x, "self_attn.q_proj").view(bs, q_len, -1, c.head_dim),
                 w[p + "self_attn.q_norm.weight"], c.rms_norm_eps).transpose(1, 2)
        kv_in = torch.cat([ctx, x], dim=1)
        k = _rms(lin(kv_in, "self_attn.k_proj").view(bs, kv_in.shape[1], -1, c.head_dim),
                 w[p + "self_attn.k_norm.weight"], c.rms_norm_eps).transpose(1, 2)
        v = lin(kv_in, "self_attn.v_proj").view(bs, kv_in.shape[1], -1, c.head_dim).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos[:, -q_len:], sin[:, -q_len:])
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c.head_dim), dim=-1) @ v
        h = h + lin(attn.transpose(1, 2).reshape(bs, q_len, -1), "self_attn.o_proj")
        x = _rms(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        h = h + lin(torch.nn.functional.silu(lin(x, "mlp.gate_proj")) * lin(x, "mlp.up_proj"),
                    "mlp.down_proj")
    return _rms(h, w["norm.weight"], c.rms_norm_eps)


@pytest.mark.parametrize("bias", [False, True])
def test_forward_matches_zlab_reference(bias: bool) -> None:
    target = tiny_target("qwen3")
    drafter = tiny_drafter(target, num_layers=2)
    if bias:  # attention_bias adds q/k/v/o biases, as Qwen3Attention
        cfg = dataclasses.replace(drafter.config, attention_bias=True)
        drafter = DFlashDrafter(cfg).to(torch.float64)
        with torch.no_grad():
            for p in drafter.parameters():
                p.normal_(0.0, 0.2)
    torch.manual_seed(1)
    bs, ctx_len, block = 2, 6, drafter.block_size
    feats = torch.randn(bs, ctx_len, drafter.config.num_context_features, dtype=torch.float64)
    noise = torch.randn(bs, block, 32, dtype=torch.float64)
    pos = (torch.arange(ctx_len + block) + 3).expand(bs, -1)
    ours = drafter(noise, pos[:, ctx_len:], drafter.project_context(feats, pos[:, :ctx_len]))
    torch.testing.assert_close(ours, zlab_forward(drafter, feats, noise, pos), rtol=1e-6, atol=1e-6)


def test_context_in_chunks_equals_at_once() -> None:
    drafter = tiny_drafter(tiny_target("llama"), num_layers=2)
    feats = torch.randn(1, 9, drafter.config.num_context_features, dtype=torch.float64)
    pos = torch.arange(9)[None]
    cache = DraftContextCache()
    for lo, hi in ((0, 4), (4, 5), (5, 9)):
        cache.append(drafter.project_context(feats[:, lo:hi], pos[:, lo:hi]))
    whole = drafter.project_context(feats, pos)
    assert cache.length == 9 and cache.kv is not None
    for a, b in zip(cache.kv.keys + cache.kv.values, whole.keys + whole.values, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    cache.crop(4)
    assert cache.length == 4 and cache.kv.keys[0].shape == (1, 2, 4, 8)
    cache.append(whole.narrow(4, 5))
    torch.testing.assert_close(cache.kv.values[1], whole.values[1])
    with pytest.raises(ValueError, match="crop length"):
        cache.crop(10)
    cache.reset()
    assert cache.length == 0 and cache.kv is None


def test_context_kv_helpers() -> None:
    k = torch.randn(1, 2, 3, 4)
    a = ContextKV(keys=(k,), values=(k + 1,))
    b = ContextKV(keys=(torch.zeros(3, 2, 2, 4),), values=(torch.ones(3, 2, 2, 4),))
    ab = a.cat(b)
    assert ab.length == 5 and ab.batch_size == 3
    assert torch.equal(ab.keys[0][2, :, :3], k[0]) and torch.equal(ab.narrow(3, 2).values[0], b.values[0])
    assert ab.select_rows(slice(1, 2)).batch_size == 1
    with pytest.raises(ValueError, match="one key and one value"):
        ContextKV(keys=(k,), values=())


def test_forward_input_validation() -> None:
    drafter = tiny_drafter(tiny_target("qwen3"))
    x, pos = torch.zeros(1, 8, 32, dtype=torch.float64), torch.arange(8)[None]
    with pytest.raises(ValueError, match="attention_mask"):
        drafter(x, pos, None, torch.ones(1, 8, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask"):
        drafter(x, pos, None, torch.ones(1, 8, 8, dtype=torch.long))
    mask = torch.ones(1, 8, 8, dtype=torch.bool)
    mask[0, 3] = False
    with pytest.raises(ValueError, match="attends to nothing"):
        drafter(x, pos, None, mask)
    with pytest.raises(ValueError, match="features"):
        drafter.project_context(torch.zeros(1, 2, 31, dtype=torch.float64), pos[:, :2])
    with pytest.raises(ValueError, match="positions"):
        drafter.project_context(torch.zeros(1, 2, 32, dtype=torch.float64), pos[:, :2].int())


def test_sliding_layers_not_implemented() -> None:
    cfg = dataclasses.replace(DFlashConfig.from_dict(QWEN3_4B_DFLASH_CONFIG),
                              layer_types=("full_attention", "sliding_attention"), sliding_window=8)
    with pytest.raises(NotImplementedError, match="full_attention"):
        DFlashDrafter(cfg)


# -- target compatibility -------------------------------------------------------------


def test_validate_target() -> None:
    target = tiny_target("qwen3")
    drafter = tiny_drafter(target)
    drafter.validate_target(target.config)
    wider = tiny_target("qwen3", hidden_size=48, num_heads=6)
    with pytest.raises(ValueError, match="hidden_size"):
        drafter.validate_target(wider.config)
    with pytest.raises(ValueError, match="mask_token_id"):
        drafter.validate_target(tiny_target("qwen3", vocab_size=16).config)
    with pytest.raises(ValueError, match="mask_token_id"):
        tiny_drafter(target, mask_token_id=-1)
    with pytest.raises(ValueError, match="target_layer_ids"):
        tiny_drafter(target, target_layer_ids=[1, 4])
    shallow = tiny_target("qwen3", num_layers=2)
    with pytest.raises(ValueError, match="target_layer_ids"):
        drafter.validate_target(shallow.config)  # id 2 is not a layer of a 2-layer target
    deeper = tiny_target("qwen3", num_layers=6)
    with pytest.warns(UserWarning, match="num_target_layers"):
        drafter.validate_target(deeper.config)
    with pytest.raises(ValueError, match="num_target_layers"):
        drafter.validate_target(deeper.config, strict=True)


# -- checkpoints ----------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_save_load_round_trip(tmp_path: Path, family: str) -> None:
    drafter = tiny_drafter(tiny_target(family), num_layers=2)
    folder = write_zlab_drafter(drafter, tmp_path / "d")
    saved = json.loads((folder / "config.json").read_text())
    assert saved["architectures"] == ["DFlashDraftModel"] and saved["model_type"] == "qwen3"
    assert saved["dtype"] == "float64" and saved["dflash_config"]["target_layer_ids"] == [1, 2]
    assert set(load_file(folder / "model.safetensors")) == _zlab_names(2)
    loaded = DFlashDrafter.from_pretrained(folder)
    assert not loaded.training and loaded.fc.weight.dtype == torch.float64
    for k, v in drafter.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), k
    feats = torch.randn(1, 5, drafter.config.num_context_features, dtype=torch.float64)
    x, pos = torch.randn(1, 8, 32, dtype=torch.float64), torch.arange(13)[None]
    outs = [m(x, pos[:, 5:], m.project_context(feats, pos[:, :5])) for m in (drafter, loaded)]
    # bit-equal weights (above); the loaded ones live at other addresses, and on some CPUs
    # (AMD, AVX2) the GEMM kernels then sum in another order: equal to float64 rounding
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-12)
    assert DFlashDrafter.from_pretrained(folder, dtype=torch.bfloat16).norm.weight.dtype == torch.bfloat16


def test_released_folder_loads_unchanged(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B_DFLASH_CONFIG, indent=2))
    cfg = DFlashConfig.from_dict(QWEN3_4B_DFLASH_CONFIG)
    torch.manual_seed(0)
    shapes = {k: v.shape for k, v in DFlashDrafter(cfg).state_dict().items()}
    save_file({k: torch.randn(s).to(torch.bfloat16) for k, s in shapes.items()},
              str(tmp_path / "model.safetensors"))
    drafter = DFlashDrafter.from_pretrained(tmp_path)
    assert drafter.fc.weight.dtype == torch.bfloat16 and drafter.block_size == 16
    assert drafter.mask_token_id == 151669 and drafter.target_layer_ids == (1, 9, 17, 25, 33)
    feats = torch.randn(1, 3, 5 * 32, dtype=torch.bfloat16)
    out = drafter(torch.randn(1, 16, 32, dtype=torch.bfloat16), torch.arange(3, 19)[None],
                  drafter.project_context(feats, torch.arange(3)[None]))
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    drafter.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == QWEN3_4B_DFLASH_CONFIG
    again = load_file(tmp_path / "again" / "model.safetensors")
    assert all(torch.equal(again[k], v) for k, v in load_file(tmp_path / "model.safetensors").items())


def test_sharded_checkpoint_loads(tmp_path: Path) -> None:
    drafter = tiny_drafter(tiny_target("qwen3"), num_layers=2)
    write_zlab_drafter(drafter, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / file))
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in drafter.state_dict().items())


def test_strict_loading_lists_bad_tensors(tmp_path: Path) -> None:
    write_zlab_drafter(tiny_drafter(tiny_target("qwen3")), tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["layers.0.mlp.up_proj.weight"]
    state["lm_head.weight"] = torch.zeros(32, 32)
    state["fc.weight"] = torch.zeros(32, 64)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"(?s)missing.*up_proj.*unexpected.*lm_head.*fc\.weight"):
        DFlashDrafter.from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        DFlashDrafter.from_pretrained(tmp_path)


# -- multi-anchor drafting --------------------------------------------------------------


def _features(target: torch.nn.Module, ids: torch.Tensor, layer_ids: tuple[int, ...]) -> torch.Tensor:
    """Target features ``[bs, T, K*H]``: HF hidden_states[l + 1] over layer_ids."""
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1] for i in layer_ids], dim=-1)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_multi_anchor_equals_separate_blocks(family: str) -> None:
    target = tiny_target(family)
    drafter = tiny_drafter(target, num_layers=2, block_size=6)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    gen = torch.Generator().manual_seed(3)
    bs, c_len, n_extra, num_blocks, block = 2, 7, 4, 5, drafter.block_size
    ids = torch.randint(3, 31, (bs, c_len + n_extra), generator=gen)
    feats = _features(target, ids, drafter.target_layer_ids)
    cache = DraftContextCache()  # one shared committed context, batch 1 (rows broadcast)
    cache.append(drafter.project_context(feats[:1, :c_len], torch.arange(c_len)[None]))
    extra = feats[:, c_len:]
    extra[1] = extra[1].flip(0)  # rows may carry different extra context
    visible = torch.tensor([[0, 1, 2, 4, 3], [0, 4, 0, 2, 1]])
    anchors = torch.randint(0, 32, (bs, num_blocks), generator=gen)
    positions = c_len + visible + torch.tensor([[0, 0, 0, 0, 5], [0, 0, 2, 0, 1]])
    with torch.no_grad():
        hidden = draft_hidden(drafter, cache, anchors, positions, extra, visible, emb)
        tokens = draft_blocks(drafter, cache, anchors, positions, extra, visible, emb, head)
    assert tokens.shape == (bs, num_blocks, block) and tokens.dtype == torch.long
    assert torch.equal(tokens[:, :, 0], anchors)
    for b in range(bs):
        for r in range(num_blocks):
            v = int(visible[b, r])
            block_ids = torch.full((1, block), drafter.mask_token_id)
            block_ids[0, 0] = anchors[b, r]
            ctx = drafter.project_context(feats[:1, :c_len], torch.arange(c_len)[None])
            if v:
                ctx = ctx.cat(drafter.project_context(extra[b:b + 1, :v], torch.arange(c_len, c_len + v)[None]))
            with torch.no_grad():  # plain single-block DFlash, everything visible
                ref = drafter(emb(block_ids), positions[b, r] + torch.arange(block)[None], ctx)
            torch.testing.assert_close(hidden[b, r], ref[0], rtol=1e-5, atol=1e-5)
            assert torch.equal(tokens[b, r, 1:], head(ref[0, 1:]).argmax(-1))


def test_row_zero_is_plain_dflash() -> None:
    target = tiny_target("qwen3")
    drafter = tiny_drafter(target, num_layers=2)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    ids = torch.randint(3, 31, (1, 10), generator=torch.Generator().manual_seed(0))
    feats = _features(target, ids, drafter.target_layer_ids)
    cache = DraftContextCache()
    cache.append(drafter.project_context(feats[:, :6], torch.arange(6)[None]))
    anchors = torch.tensor([[int(ids[0, 6]), int(ids[0, 7])]])
    with torch.no_grad():
        got = draft_hidden(drafter, cache, anchors, torch.tensor([[6, 7]]), feats[:, 6:7],
                           torch.tensor([[0, 1]]), emb)
        # z-lab's call: fresh context features and positions ctx..block, no mask
        block = torch.full((1, 8), drafter.mask_token_id)
        block[0, 0] = anchors[0, 0]
        ref = zlab_forward(drafter, feats[:, :6], emb(block), torch.arange(14)[None])
    torch.testing.assert_close(got[0, 0], ref[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(head(got[0, 0, 1:]).argmax(-1), head(ref[0, 1:]).argmax(-1))


def test_multi_anchor_without_context_and_validation() -> None:
    target = tiny_target("llama")
    drafter = tiny_drafter(target)
    emb, head = target.get_input_embeddings(), target.get_output_embeddings()
    anchors, zero = torch.tensor([[4, 5]]), torch.zeros(1, 2, dtype=torch.long)
    out = draft_blocks(drafter, DraftContextCache(), anchors, zero, None, zero, emb, head)
    assert out.shape == (1, 2, 8) and torch.equal(out[:, :, 0], anchors)
    with pytest.raises(ValueError, match="extra_visible"):
        draft_blocks(drafter, DraftContextCache(), anchors, zero, None, zero + 1, emb, head)
    with pytest.raises(ValueError, match="anchor_positions"):
        draft_blocks(drafter, DraftContextCache(), anchors, zero.int(), None, zero, emb, head)


def test_multi_anchor_mask_layout() -> None:
    m = multi_anchor_mask(2, torch.tensor([[0, 2, 1]]), 3, 2)
    assert m.shape == (1, 6, 2 + 3 + 6)
    assert m[0, :, :2].all()
    assert m[0, :, 2:5].int().tolist() == [[0, 0, 0]] * 2 + [[1, 1, 0]] * 2 + [[1, 0, 0]] * 2
    own = m[0, :, 5:].int()
    assert torch.equal(own, torch.block_diag(*[torch.ones(2, 2, dtype=torch.int32)] * 3))
