"""``$SGLANG_REANCHOR_PACK_LINEARS=1`` (`sglang_reanchor.srt.packed_linears`): SGLang's own
unquantized linear method computes the same through the packed hook, prefill-sized and
non-float32 inputs keep SGLang's path, a weight changed in place is packed again, the hooks
are installed only when asked, and a served REANCHOR pair with them gives the reference
engine's tokens."""

from __future__ import annotations

import pytest
import torch
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from test_serving_cpu import PROMPTS, ROUNDS, pair, serve  # noqa: F401  (pair: a fixture)

from sglang_reanchor import SpeculativeGenerator
from sglang_reanchor.drafter.draft_vocab import DraftVocabHead
from sglang_reanchor.engine.packed_linear import MAX_ROWS, packing_available
from sglang_reanchor.srt import packed_linears, seam
from sglang_reanchor.srt.settings import parse_config

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear ops")


def sglang_linear(in_features: int, out_features: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A layer holding its weight the way SGLang's ``UnquantizedLinearMethod`` creates it."""
    layer = torch.nn.Module()
    UnquantizedLinearMethod().create_weights(layer, in_features, [out_features], in_features, out_features, dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(1)))
    return layer


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 48), (2, 48), (3, 5, 48), (MAX_ROWS, 48), (MAX_ROWS + 1, 48)])
def test_the_hook_computes_sglangs_linear(bias, shape):
    method, layer = UnquantizedLinearMethod(), sglang_linear(48, 40)
    b = torch.randn(40) if bias else None
    x = torch.randn(*shape)
    got = packed_linears._packed_apply(UnquantizedLinearMethod.apply, method, layer, x, b)
    torch.testing.assert_close(got, method.apply(layer, x, b), rtol=1e-5, atol=1e-5)
    rows = x.numel() // x.shape[-1]
    assert ("_reanchor_packed" in layer.__dict__) == (rows <= MAX_ROWS)  # prefill-sized: SGLang's own path


def test_other_dtypes_keep_sglangs_path_and_an_updated_weight_is_packed_again():
    method = UnquantizedLinearMethod()
    half = sglang_linear(32, 16, torch.bfloat16)
    x = torch.randn(2, 32, dtype=torch.bfloat16)
    assert torch.equal(packed_linears._packed_apply(UnquantizedLinearMethod.apply, method, half, x),
                       method.apply(half, x))
    assert "_reanchor_packed" not in half.__dict__
    layer, x = sglang_linear(32, 16), torch.randn(2, 32)
    packed_linears._packed_apply(UnquantizedLinearMethod.apply, method, layer, x)
    with torch.no_grad():
        layer.weight.mul_(-2.0)  # an in-place update (SGLang's weight loaders write so)
    got = packed_linears._packed_apply(UnquantizedLinearMethod.apply, method, layer, x)
    torch.testing.assert_close(got, method.apply(layer, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, MAX_ROWS, MAX_ROWS + 1])
def test_the_draft_vocabulary_head_packs_like_the_lm_head(rows):
    """The worker's draft-vocabulary logits on a packing server: the packed kernel on the head's
    own rows (its bias too), SGLang's path (None) past `MAX_ROWS`. The worker builds the head in
    ``inference_mode`` (its rows are inference tensors, which have no version counter)."""
    gen = torch.Generator().manual_seed(2)
    lm_head = torch.nn.Linear(48, 100, bias=True)
    x = torch.randn(rows, 48, generator=gen)
    with torch.inference_mode():
        head = DraftVocabHead(lm_head, torch.randperm(100, generator=gen)[:40])
        got = packed_linears.packed_linear_or_none(head, head.weight, x, head.bias)
        again = packed_linears.packed_linear_or_none(head, head.weight, x, head.bias)  # the packed copy kept
    if rows > MAX_ROWS:
        assert got is None
    else:
        assert got is not None
        assert again is not None and torch.equal(got, again)
        torch.testing.assert_close(got, head(x), rtol=1e-5, atol=1e-5)
        assert torch.equal(head.token_ids[got.argmax(-1)], head.token_ids[head(x).argmax(-1)])


def test_a_weight_made_in_inference_mode_is_packed_once():
    """Inference tensors have no version counter: such a weight is keyed without one, packed at
    its first use and reused after (the kernel's answer is SGLang's)."""
    method = UnquantizedLinearMethod()
    x = torch.randn(3, 32)
    with torch.inference_mode():
        layer = sglang_linear(32, 16)
        first = packed_linears._packed_apply(UnquantizedLinearMethod.apply, method, layer, x)
        packed = layer.__dict__["_reanchor_packed"][1]
        again = packed_linears._packed_apply(UnquantizedLinearMethod.apply, method, layer, x)
        assert layer.__dict__["_reanchor_packed"][1] is packed
        torch.testing.assert_close(first, method.apply(layer, x), rtol=1e-5, atol=1e-5)
    assert torch.equal(first, again)


def test_the_hooks_are_installed_only_when_asked(monkeypatch):
    opt_in = [h for h in seam.HOOKS if h.opt_in]
    assert {h.name for h in opt_in} == {"packed-linear", "packed-lm-head"}
    assert all(h.plain_cpu_only and h.when == "load" for h in opt_in)
    monkeypatch.delenv(packed_linears.PACK_LINEARS_ENV, raising=False)
    assert not any(seam._opted_in(h) for h in opt_in)
    monkeypatch.setenv(packed_linears.PACK_LINEARS_ENV, "1")
    assert all(seam._opted_in(h) for h in opt_in)
    monkeypatch.setenv(packed_linears.PACK_LINEARS_ENV, "yes")
    with pytest.raises(ValueError, match="SGLANG_REANCHOR_PACK_LINEARS must be 0 or 1, got 'yes'"):
        seam._opted_in(opt_in[0])


def test_a_served_pair_with_packed_linears_gives_the_reference_tokens(pair, tmp_path):  # noqa: F811
    """The hooks in every process of a REANCHOR engine (its log says so); tokens equal the unpacked
    reference engine's on this pair, with the draft-vocabulary head (packed too) and branching."""
    root, target, drafter = pair
    config = '{"policy": "offset", "branch_width": 2, "branch_rows": 4, "draft_vocab": 48}'
    got = serve(root, "REANCHOR", ROUNDS[:2], config, None,
                extra_env={packed_linears.PACK_LINEARS_ENV: "1"}, want_log=True)
    assert "float32 CPU linears run on oneDNN weights packed once" in got.pop("_log")
    reference = SpeculativeGenerator(target, drafter, config=parse_config(config))
    for rid, (prompt, n) in [*PROMPTS.items(), ("a-again", PROMPTS["a"])]:
        assert got[rid]["output_ids"] == reference.generate(prompt, n, method="reanchor").tokens, rid
