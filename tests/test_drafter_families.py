"""Domino and DSpark drafters: SGLang 0.5.23's config fields and tensor names, strict
loading with errors naming the field, save -> load round trips, family dispatch.

(Their rollouts: test_family_rollouts.py; lossless decoding: test_family_lossless.py;
SGLang's own loaders and rollouts as the oracle: tests_sglang/test_drafter_families.py.)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from factories import tiny_domino_drafter, tiny_drafter, tiny_dspark_drafter, tiny_target
from safetensors.torch import load_file, save_file

from sglang_reanchor.drafter import (
    ArgmaxHead,
    DFlashDrafter,
    DominoDrafter,
    DominoHead,
    DominoSettings,
    DSparkDrafter,
    DSparkHead,
    DSparkSettings,
    drafter_family,
)

BACKBONE = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
    f"layers.0.{n}.weight" for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                     "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
                                     "mlp.down_proj", "input_layernorm", "post_attention_layernorm")}
# the names SGLang's DFlashDraftModel.load_weights requires of a Domino checkpoint
DOMINO = {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight"}
MARKOV = {"vanilla": {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"}}
MARKOV["gated"] = MARKOV["vanilla"] | {"markov_head.gate_proj.weight", "markov_head.gate_proj.bias"}
MARKOV["rnn"] = MARKOV["vanilla"] | {"markov_head.joint_proj.weight", "markov_head.joint_proj.bias"}
CONFIDENCE = {"confidence_head.proj.weight", "confidence_head.proj.bias"}


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3")  # vocab 32, hidden 32, 4 layers


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def _rollout(drafter, target, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    width = drafter.block_size
    hidden = torch.randn(2, 3, width, drafter.config.hidden_size, generator=g, dtype=torch.float64)
    anchors = torch.randint(0, drafter.config.vocab_size, (2, 3), generator=g)
    return drafter.head.rollout(hidden, anchors, embed_tokens=target.get_input_embeddings(),
                                lm_head=target.get_output_embeddings(), num_drafts=width - 1)


# -- Domino ----------------------------------------------------------------------------


@pytest.mark.parametrize("shift_label", [True, False])
def test_domino_round_trip_in_sglangs_format(tmp_path: Path, target, shift_label: bool) -> None:
    drafter = tiny_domino_drafter(target, shift_label=shift_label, gru_hidden_dim=6, emb_dim=12)
    drafter.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert {k: cfg["dflash_config"][k] for k in ("projector_type", "shift_label", "pure_draft_prefix_len",
                                                  "gru_hidden_dim", "emb_dim")} == {
        "projector_type": "domino", "shift_label": shift_label, "pure_draft_prefix_len": 1,
        "gru_hidden_dim": 6, "emb_dim": 12}
    state = load_file(tmp_path / "model.safetensors")
    assert set(state) == BACKBONE | DOMINO
    assert state["prefix_gru.weight_ih_l0"].shape == (18, 32) and state["prefix_gru.weight_hh_l0"].shape == (18, 6)
    assert state["embed_proj.0.weight"].shape == (12, 38) and state["embed_proj.2.weight"].shape == (32, 12)
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert type(loaded) is DominoDrafter and isinstance(loaded.head, DominoHead) and not loaded.training
    assert loaded.domino == drafter.domino and loaded.head.candidate_pool_size == 2048  # SGLang's default
    _same_state(drafter, loaded)
    assert torch.equal(_rollout(drafter, target), _rollout(loaded, target))
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == cfg
    assert DominoDrafter.from_pretrained(tmp_path).domino == drafter.domino


def test_domino_fields_at_the_top_level_load_and_stay_there(tmp_path: Path, target) -> None:
    drafter = tiny_domino_drafter(target)
    drafter.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key in ("shift_label", "pure_draft_prefix_len", "gru_hidden_dim", "emb_dim"):
        cfg[key] = cfg["dflash_config"].pop(key)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert loaded.domino == drafter.domino
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == cfg


@pytest.mark.parametrize(("change", "message"), [
    ({"shift_label": None}, "shift_label to be a bool, got None"),
    ({"shift_label": 1}, "shift_label to be a bool, got 1"),
    ({"pure_draft_prefix_len": 2}, "pure_draft_prefix_len=1, got 2"),
    ({"pure_draft_prefix_len": None}, "pure_draft_prefix_len=1, got None"),
    ({"pure_draft_prefix_len": "one"}, "Invalid DFLASH Domino pure_draft_prefix_len='one'"),
    ({"gru_hidden_dim": None}, "requires dflash_config.gru_hidden_dim"),
    ({"gru_hidden_dim": 0}, "gru_hidden_dim must be positive, got 0"),
    ({"emb_dim": None}, "requires dflash_config.emb_dim"),
    ({"projector_type": "causal_v5"}, "projector_type must be absent .DFlash. or 'domino', got 'causal_v5'"),
])
def test_domino_config_errors_name_the_field(tmp_path: Path, target, change: dict, message: str) -> None:
    tiny_domino_drafter(target).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key, value in change.items():
        if value is None:
            del cfg["dflash_config"][key]
        else:
            cfg["dflash_config"][key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message):
        DFlashDrafter.from_pretrained(tmp_path)


def test_domino_emb_dim_in_both_places_must_agree() -> None:
    raw = {"dflash_config": {"projector_type": "domino", "shift_label": True, "pure_draft_prefix_len": 1,
                             "gru_hidden_dim": 4, "emb_dim": 8}, "emb_dim": 9}
    with pytest.raises(ValueError, match="emb_dim differs between dflash_config and the top-level config: 8 != 9"):
        DominoSettings.from_dict(raw)
    raw["emb_dim"] = 8
    assert DominoSettings.from_dict(raw).emb_dim == 8


def test_domino_weights_are_checked(tmp_path: Path, target) -> None:
    tiny_domino_drafter(target).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    bad = dict(state)
    del bad["embed_proj.2.weight"]
    bad["embed_proj.0.weight"] = torch.zeros(3, 3, dtype=torch.float64)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"(?s)Domino drafter config.*missing.*embed_proj\.2.*wrong shapes.*embed_proj\.0"):
        DFlashDrafter.from_pretrained(tmp_path)
    # SGLang resolves "model."-prefixed names too
    save_file({f"model.{k}": v for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    assert type(DFlashDrafter.from_pretrained(tmp_path)) is DominoDrafter


def test_domino_weights_in_a_dflash_folder_are_refused(tmp_path: Path, target) -> None:
    """SGLang refuses them ("Domino projector weights but projector_type=None"); so does the strict loader."""
    tiny_domino_drafter(target).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["dflash_config"]["projector_type"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"(?s)DFlash drafter config.*unexpected tensors.*embed_proj"):
        DFlashDrafter.from_pretrained(tmp_path)


# -- DSpark ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("sample_from_anchor", [True, False])
def test_dspark_round_trip_in_sglangs_format(tmp_path: Path, target, kind: str, sample_from_anchor: bool) -> None:
    drafter = tiny_dspark_drafter(target, block_size=6, markov_head_type=kind, markov_rank=5,
                                  sample_from_anchor=sample_from_anchor)
    assert drafter.gamma == 6 and drafter.block_size == (6 if sample_from_anchor else 7)  # query slots
    drafter.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["block_size"] == 6
    assert (cfg["markov_rank"], cfg["markov_head_type"], cfg["sample_from_anchor"]) == (5, kind, sample_from_anchor)
    state = load_file(tmp_path / "model.safetensors")
    assert set(state) == BACKBONE | MARKOV[kind] | CONFIDENCE
    assert state["markov_head.markov_w1.weight"].shape == state["markov_head.markov_w2.weight"].shape == (32, 5)
    assert state["confidence_head.proj.weight"].shape == (1, 32 + 5)
    if kind == "gated":
        assert state["markov_head.gate_proj.weight"].shape == (5, 32 + 5)
    if kind == "rnn":
        assert state["markov_head.joint_proj.weight"].shape == (15, 10 + 32)
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert type(loaded) is DSparkDrafter and isinstance(loaded.head, DSparkHead)
    assert loaded.dspark == drafter.dspark and loaded.block_size == drafter.block_size
    _same_state(drafter, loaded)
    assert torch.equal(_rollout(drafter, target), _rollout(loaded, target))
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == cfg


def test_dspark_folder_without_confidence_head_and_with_target_weights(tmp_path: Path, target) -> None:
    """SGLang skips lm_head / embed_tokens / rotary_emb tensors of a DSpark folder; with no
    confidence tensors the drafter has no confidence head (SGLang's default builds none)."""
    drafter = tiny_dspark_drafter(target)
    drafter.save_pretrained(tmp_path)
    state = {k: v for k, v in load_file(tmp_path / "model.safetensors").items() if not k.startswith("confidence")}
    state["lm_head.weight"] = torch.zeros(32, 32, dtype=torch.float64)
    state["model.embed_tokens.weight"] = torch.zeros(32, 32, dtype=torch.float64)
    save_file(state, str(tmp_path / "model.safetensors"))
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert loaded.confidence_head is None and "confidence_head.proj.weight" not in loaded.state_dict()
    assert torch.equal(_rollout(drafter, target), _rollout(loaded, target))
    with pytest.raises(ValueError, match="no confidence head"):
        loaded.head.confidence(torch.zeros(1, 1, 8, 32), torch.zeros(1, 1, dtype=torch.long),
                               torch.zeros(1, 1, 3, dtype=torch.long))
    del state["markov_head.markov_w2.weight"]  # SGLang would leave it uninitialised; here it is an error
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"(?s)DSpark drafter config.*missing tensors.*markov_w2"):
        DFlashDrafter.from_pretrained(tmp_path)


def _dspark_raw(target, **top) -> dict:
    raw = tiny_dspark_drafter(target).config_dict()
    raw.update(top)
    return {k: v for k, v in raw.items() if v is not None}


@pytest.mark.parametrize(("top", "nested", "message"), [
    ({"markov_rank": None}, {}, "DSpark draft requires markov_rank > 0, got markov_rank=0"),
    ({"markov_rank": None}, {"markov_rank": 4}, "got markov_rank=0 at the top level of config.json"),
    ({"markov_rank": 4}, {"markov_rank": 8}, r"markov_rank differs between dflash_config/dspark_config \(8\) and "
                                             r"the top-level config \(4\)"),
    ({"markov_rank": "four"}, {}, "Invalid DSpark markov_rank='four'"),
    ({"markov_head_type": None}, {}, "requires markov_head_type when markov_rank > 0"),
    ({"markov_head_type": "lstm"}, {}, "Unsupported DSpark markov_head_type='lstm'"),
    ({"markov_head_type": None}, {"markov_head_type": "gated"}, "markov_head_type differs"),
    ({"sample_from_anchor": "yes"}, {}, "sample_from_anchor must be a bool"),
    ({"enable_confidence_head": 1}, {}, "enable_confidence_head must be a bool"),
    ({"dspark_markov_rank": 4}, {}, "bundled in a target checkpoint"),
    ({}, {"projector_type": "domino"}, "a DSpark drafter has no projector_type"),
])
def test_dspark_config_errors_name_the_field(target, top: dict, nested: dict, message: str) -> None:
    raw = _dspark_raw(target, **top)
    raw["dflash_config"].update(nested)
    with pytest.raises(ValueError, match=message):
        DSparkDrafter._from_raw(raw)


def test_dspark_fields_sglang_reads_elsewhere(target) -> None:
    raw = _dspark_raw(target)
    raw["dspark_config"] = {"markov_rank": 4, "markov_head_type": "vanilla", "mask_token_id": 5}
    drafter = DSparkDrafter._from_raw(raw)  # SGLang's DSpark parser reads dspark_config first
    assert drafter.mask_token_id == 5 and drafter.dspark.markov_rank == 4
    del raw["sample_from_anchor"], raw["enable_confidence_head"], raw["confidence_head_with_markov"]
    assert DSparkSettings.from_dict(raw) == DSparkSettings(markov_rank=4)  # SGLang's defaults


def test_markov_fields_on_a_dflash_architecture_are_refused(target) -> None:
    raw = _dspark_raw(target, architectures=["DFlashDraftModel"])
    with pytest.raises(ValueError, match="markov_rank but architectures"):
        drafter_family(raw)


# -- dispatch and the target ----------------------------------------------------------------


def test_family_dispatch(tmp_path: Path, target) -> None:
    tiny_drafter(target).save_pretrained(tmp_path / "dflash")
    tiny_domino_drafter(target).save_pretrained(tmp_path / "domino")
    tiny_dspark_drafter(target).save_pretrained(tmp_path / "dspark")
    plain = DFlashDrafter.from_pretrained(tmp_path / "dflash")
    assert type(plain) is DFlashDrafter and isinstance(plain.head, ArgmaxHead)
    for name, cls in (("domino", DominoDrafter), ("dspark", DSparkDrafter)):
        assert drafter_family(json.loads((tmp_path / name / "config.json").read_text())) == name
        assert type(cls.from_pretrained(tmp_path / name)) is cls
        with pytest.raises(ValueError, match="describes a DFlash drafter, not a"):
            cls.from_pretrained(tmp_path / "dflash")
    with pytest.raises(ValueError, match="describes a DSpark drafter, not a Domino one"):
        DominoDrafter.from_pretrained(tmp_path / "dspark")


@pytest.mark.parametrize("make", [tiny_domino_drafter, tiny_dspark_drafter])
def test_family_heads_need_the_targets_vocabulary(make) -> None:
    drafter = make(tiny_target("qwen3", vocab_size=32))
    config = copy.deepcopy(tiny_target("qwen3", vocab_size=40).config)
    with pytest.raises(ValueError, match="vocab_size: the .* head .* 32 tokens"):
        drafter.validate_target(config)
