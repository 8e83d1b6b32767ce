"""Workarounds, through SGLang's ``HookRegistry``, that let SGLang 0.5.23 serve on a plain CPU.

SGLang's own CPU path (``SGLANG_USE_CPU_ENGINE=1``) needs ``sgl_kernel`` built for
Intel AMX. Without it, ``--device cpu`` runs the pure-torch layers, except that:

- ``RotaryEmbedding.__init__`` imports ``vllm._custom_ops.rotary_embedding`` on a
  device it does not recognise (``layers/rotary_embedding/base.py``), although its
  forward then runs the native torch path anyway. The hook makes the constructor
  take the branch it takes on MPS/CPU/XPU (no fallback kernel), only while it runs.

The plain-CPU hooks are registered only on a machine where SGLang sees no accelerator
platform (no CUDA/HIP/XPU/NPU/MUSA, no CPU engine): there the patched code would
otherwise fail, so they change nothing anywhere else. `seam` registers every hook
(its table says which, when, and why); this module holds their implementations.

Two hooks are not CPU-specific; they are installed only in a process that serves
REANCHOR (``seam.install("worker")``, called by ``ReAnchorWorker.__init__``), so a
plain or DFLASH server with this package installed runs SGLang's own functions:

- The Triton attention backend calls its extend kernel with
  ``skip_prefix_custom_mask=True``: a custom mask governs only the new tokens and
  every query sees the whole prefix. ReAnchor's drafter forward puts the
  rejected-suffix context rows at the end of the prefix and must hide them from
  the baseline block (`layout.draft_window`). For a forward whose ``spec_info``
  sets ``masks_prefix = True`` (only ReAnchor's draft window does), the hook runs
  the kernel with ``skip_prefix_custom_mask=False``; every other forward is
  untouched. (FlashInfer applies the whole FULL_MASK row already.)

- (plain CPU only) The DFlash drafter's attention (``models/dflash.py``) runs its
  bfloat16 QK-RMSNorm + RoPE through a Triton kernel (``table_qk_norm_rope_``), in the
  interpreter on a CPU: minutes per drafter forward for SmolLM2's drafter. The hook
  replaces it with the same arithmetic in torch (`_table_qk_norm_rope_torch`: norm in
  float32, rounded to bfloat16, then the neox rotation from the same cos/sin table).

- (plain CPU only) ``GroupCoordinator.all_gather_into_tensor`` sends every non-CPU-engine
  tensor through the custom op ``sglang::reg_all_gather_into_tensor``, which has no CPU
  kernel; DFlash's TP-safe argmax over the vocab-parallel LM head calls it, so a
  ``--tp-size 2`` REANCHOR server on a plain CPU died at its first draft. The hook sends
  CPU tensors through SGLang's own non-custom-op path (``_all_gather_into_tensor``, torch
  distributed on the gloo group), as SGLang does for its CPU engine.

- (plain CPU only) A speculative decode step's KV reservation writes the new slots into
  ``req_to_token`` with SGLang's Triton kernel ``assign_req_to_token_pool`` (its CPU branch
  needs ``sgl_kernel``): in the interpreter, about 7 % of a served REANCHOR round at
  concurrency 16. The hook does the same scatter in torch (`_assign_req_to_token_torch`).

- ``ModelRunner._extend_forward_kwargs`` casts ``forward_batch.input_embeds`` to
  bfloat16 whatever the model's dtype, so a DFlash drafter run in float32 or
  float16 (its block embeddings come in as ``input_embeds``) fails with "expected
  m1 and m2 to have the same dtype". The hook casts them to the runner's dtype
  instead; for bfloat16 models nothing changes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["needs_cpu_hooks"]


def needs_cpu_hooks() -> bool:
    """True when SGLang runs here on no platform it knows (the plain-CPU case)."""
    from sglang.srt.utils import is_cpu, is_cuda, is_hip, is_musa, is_npu, is_xpu

    return not any(f() for f in (is_cuda, is_hip, is_xpu, is_npu, is_musa, is_cpu))


def _rope_init_without_vllm(original: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.layers.rotary_embedding import base

    saved = base._is_mps
    base._is_mps = True  # the constructor's "no fallback kernel" branch
    try:
        return original(*args, **kwargs)
    finally:
        base._is_mps = saved



def _embeds_in_model_dtype(original: Any, runner: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> dict:
    out = original(runner, forward_batch, *args, **kwargs)
    embeds = getattr(forward_batch, "input_embeds", None)
    dtype = getattr(runner, "dtype", None)
    if embeds is not None and "input_embeds" in out and dtype is not None and dtype != torch_bfloat16():
        out["input_embeds"] = embeds.to(dtype)
    return out


def torch_bfloat16() -> Any:
    import torch

    return torch.bfloat16



def _extend_with_prefix_mask(original: Any, backend: Any, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any,
                             *args: Any, **kwargs: Any) -> Any:
    if not getattr(getattr(forward_batch, "spec_info", None), "masks_prefix", False):
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    import functools

    kernel = backend.extend_attention_fwd
    backend.extend_attention_fwd = functools.partial(kernel, skip_prefix_custom_mask=False)
    try:
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        backend.extend_attention_fwd = kernel



def _table_qk_norm_rope_torch(original: Any, qkv: Any, positions: Any, q_weight: Any, k_weight: Any,
                              cos_sin_cache: Any, num_q_heads: int, num_k_heads: int, head_dim: int,
                              eps: float) -> None:
    """``table_qk_norm_rope_`` in torch: in place on the Q and K heads of ``qkv`` ``[T, (Hq+Hk+Hv)*D]``."""
    import torch

    del original  # the Triton kernel: only the interpreter runs it on a CPU
    t, heads, half = qkv.shape[0], num_q_heads + num_k_heads, head_dim // 2
    if t == 0:
        return
    qk = qkv[:, : heads * head_dim].view(t, heads, head_dim)  # a view: written back in place
    x = qk.float()
    weight = torch.cat([q_weight.float().expand(num_q_heads, head_dim), k_weight.float().expand(num_k_heads, head_dim)])
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight).to(torch.bfloat16).float()
    table = cos_sin_cache[positions.long()].float()  # [T, D]: cos | sin
    cos, sin = table[:, None, :half], table[:, None, half:]
    y1, y2 = y[..., :half], y[..., half:]
    qk.copy_(torch.cat([y1 * cos - y2 * sin, y2 * cos + y1 * sin], dim=-1).to(qkv.dtype))


def _assign_req_to_token_torch(original: Any, req_pool_indices: Any, req_to_token: Any, start_offset: Any,
                               end_offset: Any, out_cache_loc: Any, batch_size: int) -> None:
    """``assign_req_to_token_pool_func`` in torch: request ``i``'s columns ``start[i] .. end[i]-1`` of its
    ``req_to_token`` row take the next ``end[i] - start[i]`` entries of ``out_cache_loc``, in batch order.

    ``req_pool_indices``, ``start_offset``, ``end_offset``: ``[bs]``; ``out_cache_loc``: ``[sum(end - start)]``.
    """
    import torch

    if req_to_token.device.type != "cpu":
        return original(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size)
    start, lengths = start_offset[:batch_size].long(), (end_offset[:batch_size] - start_offset[:batch_size]).long()
    total = int(lengths.sum())  # a host read: free on a CPU
    if total == 0:
        return None
    rows = torch.repeat_interleave(torch.arange(batch_size), lengths, output_size=total)  # [total]
    first = torch.cumsum(lengths, 0) - lengths  # each request's first entry in out_cache_loc
    cols = start[rows] + torch.arange(total) - first[rows]
    req_to_token[req_pool_indices[:batch_size].long()[rows], cols] = out_cache_loc[:total].to(req_to_token.dtype)
    return None


def _all_gather_on_cpu(original: Any, group: Any, output: Any, input: Any) -> None:
    """CPU tensors through the gather SGLang uses for its CPU engine; others unchanged."""
    if output.device.type == "cpu":
        group._all_gather_into_tensor(output, input)
        return
    original(group, output, input)


def _validate_domino_on_cpu(original: Any, *, device: Any, **checks: Any) -> None:
    """SGLang's Domino checks on a CPU, all of them but the two that pin its GPU runtime.

    SGLang 0.5.23 limits DFLASH Domino to CUDA and to bfloat16 weights (its graphs and
    its memory sizing); the rollout itself (``domino_greedy_rollout``) is plain torch and
    runs on a CPU in any dtype, where REANCHOR serves Domino drafters eagerly
    (tests_sglang/test_serving_cpu.py). The device rule is passed as CUDA; the dtype rule
    is SGLang's last check, so its error means every other check passed.
    """
    import torch

    if torch.device(device).type != "cpu":
        original(device=device, **checks)
        return
    try:
        original(device=torch.device("cuda"), **checks)
    except ValueError as err:
        if not str(err).startswith("DFLASH Domino currently requires BF16"):
            raise
