"""SGLang's float32 linears and LM head on a plain CPU through oneDNN weights packed once (opt-in).

The same kernels as the engine's `sglang_reanchor.engine.packed_linear` (see there for why and
for the measurements): on a plain CPU SGLang runs every unquantized linear with ``F.linear``
(``UnquantizedLinearMethod.apply``) and the LM head with ``torch.matmul``
(``LogitsProcessor._compute_lm_head``); its own packed CPU kernels need ``sgl_kernel`` built for
Intel AMX. With ``SGLANG_REANCHOR_PACK_LINEARS=1`` two load-time hooks (`seam.HOOKS`) run float32
inputs of up to `MAX_ROWS` rows (128: decode, verify and draft steps; a longer prefill keeps SGLang's path) through
``torch.ops.mkldnn._linear_pointwise`` on a copy of the weight packed at its first use.

The hooks are load-time, so *every* server of the machine's SGLang takes them when the variable
is set, plain SGLang included: that keeps a plain-versus-REANCHOR comparison fair
(``scripts/load_bench.py --pack-linears``). Unset, nothing is hooked. A packed copy is keyed by
the weight's storage and version; weights rewritten in place behind torch's back (``.data``
writes) are not seen: leave the variable unset on a server whose weights are updated while it
runs.
"""

from __future__ import annotations

import os
from typing import Any, cast

import torch

from ..engine.packed_linear import MAX_ROWS, packing_available

__all__ = ["PACK_LINEARS_ENV", "packed_linear_or_none", "packing_requested", "packs_linears_here"]

PACK_LINEARS_ENV = "SGLANG_REANCHOR_PACK_LINEARS"


def packing_requested(environ: dict[str, str] | None = None) -> bool:
    """``$SGLANG_REANCHOR_PACK_LINEARS`` is 1 and this torch has oneDNN's packed linear ops.

    >>> packing_requested({})
    False
    """
    env = os.environ if environ is None else environ
    value = env.get(PACK_LINEARS_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{PACK_LINEARS_ENV} must be 0 or 1, got {value!r}")
    return value == "1" and packing_available()


def packs_linears_here() -> bool:
    """This process's servers run the packed hooks: packing is requested and SGLang runs on a plain
    CPU (where the load-time hooks install, `seam`)."""
    from .cpu_compat import needs_cpu_hooks

    return packing_requested() and needs_cpu_hooks()


def _packed_weight(owner: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` packed for oneDNN, made at first use and kept on ``owner``; None where it does not apply."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return None
    # an inference tensor (made under inference_mode: the worker's draft-vocabulary head) has no
    # version counter, and nothing rewrites one outside inference_mode
    key = (weight.data_ptr(), -1 if weight.is_inference() else weight._version, tuple(weight.shape))
    cached = owner.__dict__.get("_reanchor_packed")
    if cached is None or cached[0] != key:
        with torch.no_grad():
            cached = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 8))
        owner.__dict__["_reanchor_packed"] = cached
    return cached[1]


def packed_linear_or_none(owner: torch.nn.Module, weight: torch.Tensor, x: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor | None:
    """``x @ weight.T + bias`` with the packed weight, or None (SGLang's own path runs)."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() < 1:
        return None
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > MAX_ROWS or rows.shape[0] == 0 or (bias is not None and bias.dtype != torch.float32):
        return None
    packed = _packed_weight(owner, weight)
    if packed is None:
        return None
    out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


def _packed_apply(original: Any, method: Any, layer: torch.nn.Module, x: torch.Tensor,
                  bias: torch.Tensor | None = None) -> torch.Tensor:
    """``UnquantizedLinearMethod.apply``: the packed kernel for float32 decode-sized inputs."""
    from sglang.srt.utils.common import use_intel_amx_backend

    if not use_intel_amx_backend(layer):
        out = packed_linear_or_none(layer, cast(torch.Tensor, layer.weight), x, bias)
        if out is not None:
            return out
    return original(method, layer, x, bias)


def _packed_lm_head(original: Any, processor: Any, hidden_states: torch.Tensor, lm_head: Any,
                    embedding_bias: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """``LogitsProcessor._compute_lm_head``: the packed kernel where SGLang would run a plain
    float32 matmul (no LoRA, an unquantized head, no bias). That path returns a new tensor and
    leaves an ``out`` buffer unused on a CPU; so does this one."""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    plain = (type(getattr(lm_head, "quant_method", None)) is UnquantizedEmbeddingMethod
             and not hasattr(lm_head, "set_lora") and embedding_bias is None
             and getattr(processor, "rl_on_policy_target", None) is None
             and hasattr(lm_head, "weight"))
    if plain:
        out = packed_linear_or_none(lm_head, lm_head.weight, hidden_states, None)
        if out is not None:
            return out
    return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)
