"""Batched greedy generation that also returns the drafter's features, for training data.

Hugging Face ``generate`` spends most of a CPU decode step outside the GEMMs: its
SDPA path runs a flash kernel that is slow for one query row (62 % of a SmolLM2 step
at batch 128, measured), and ``DynamicCache`` grows by ``torch.cat`` every step (11 %).
Training data then needs a second full forward over ``prompt + response`` for the
features. `greedy_with_features` does both jobs in one pass over the target's own
modules (its norms, rotary embedding and weights; Q/K/V and gate/up projections
fused into one GEMM each):

- a preallocated KV cache ``[bs, kv_heads, W + max_new, head_dim]`` per layer,
- decode attention as two batched matmuls (GQA by grouping query heads); the prefill
  through SDPA's fused kernel,
- features ``hidden_states[l + 1]`` captured from the prefill and from every decode
  step (a finished row is stepped once more, so its last token gets features too),
- finished rows dropped from the batch (cache rows compacted) as they end.

Llama-family and Qwen3 decoders with full attention in every layer. The greedy
tokens are the target's: tested equal to ``generate`` in float64 on random models.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel

__all__ = ["greedy_with_features"]


class _Layer:
    """One decoder layer's weights, fused for the batched step."""

    def __init__(self, layer: torch.nn.Module) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.q_norm, self.k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        self.qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
        self.qkv_bias = torch.cat(biases) if all(b is not None for b in biases) else None
        self.splits = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features)
        self.o, self.o_bias = attn.o_proj.weight, attn.o_proj.bias
        self.gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.down = mlp.down_proj.weight
        self.act = mlp.act_fn
        self.scaling = attn.scaling


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


@torch.inference_mode()
def greedy_with_features(model: PreTrainedModel, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                         eos_ids: set[int], layer_ids: Sequence[int], pad_id: int = 0) -> list[tuple[list[int], Tensor]]:
    """Greedy responses to ``prompts`` and the features of ``prompt + response``.

    Returns per prompt ``(response, features)``: the response ids, cut after the first
    EOS (kept) or at ``max_new_tokens``; features ``[len(prompt) + len(response), K*H]``
    bfloat16, the concatenated ``hidden_states[l + 1]`` for ``l`` in ``layer_ids``,
    as ``TargetModel`` and `target_features` compute them.
    """
    cfg = model.config
    if getattr(cfg, "use_sliding_window", False) or any(
            t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ())):
        raise ValueError("greedy_with_features supports full attention in every layer only")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompts or min(len(p) for p in prompts) == 0:
        raise ValueError("greedy_with_features: every prompt needs at least one token")
    inner = model.model
    num_layers = cfg.num_hidden_layers
    bad = [lid for lid in layer_ids if not 0 <= lid < num_layers]
    if bad:
        raise ValueError(f"layer_ids {bad} are outside [0, {num_layers - 1}]")
    layers = [_Layer(layer) for layer in inner.layers[:num_layers]]
    dev, dtype = model.device, model.dtype
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = layers[0].splits[0] // n_heads
    group = n_heads // n_kv

    bs, width = len(prompts), max(len(p) for p in prompts)
    total = width + max_new_tokens  # the last response token is fed once, for its features
    ids = torch.full((bs, width), pad_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p))
    ids = ids.to(dev)
    pads = torch.tensor([width - len(p) for p in prompts], device=dev)
    cols = torch.arange(total, device=dev)
    k_cache = [torch.zeros(bs, n_kv, total, head_dim, dtype=dtype, device=dev) for _ in layers]
    v_cache = [torch.zeros_like(k) for k in k_cache]
    order = {lid: j for j, lid in enumerate(sorted(set(layer_ids)))}

    def step(x: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """Forward ``x`` ([b, n] ids, b = the caches' rows) at cache columns
        ``start .. start+n-1``; returns last-position logits [b, V], features [b, n, K*H]."""
        b, n = x.shape
        query_cols = start + torch.arange(n, device=dev)
        positions = (query_cols[None, :] - pads[:, None]).clamp(min=0)
        h = inner.embed_tokens(x)
        cos, sin = inner.rotary_emb(h, position_ids=positions)
        cos, sin = cos[:, None], sin[:, None]  # [b, 1, n, hd]
        key_cols = cols[: start + n]
        # causal, no left padding; a padding query sees itself only (no empty softmax row)
        allowed = (key_cols[None, None, :] <= query_cols[None, :, None]) & (key_cols >= pads[:, None])[:, None, :]
        allowed |= key_cols[None, None, :] == query_cols[None, :, None]  # [b, n, S]
        bias = None
        if n == 1:
            bias = torch.zeros(allowed.shape, dtype=torch.float32, device=dev).masked_fill_(~allowed, float("-inf"))
            bias = bias[:, None, None]  # [b, 1, 1, n, S]
        feats = {}
        for li, layer in enumerate(layers):
            q, k, v = F.linear(layer.input_norm(h), layer.qkv, layer.qkv_bias).split(layer.splits, dim=-1)
            q, k = q.view(b, n, n_heads, head_dim), k.view(b, n, n_kv, head_dim)
            if layer.q_norm is not None:
                q, k = layer.q_norm(q), layer.k_norm(k)
            q = _rotate(q.transpose(1, 2), cos, sin)  # [b, H, n, hd]
            k_cache[li][:, :, start: start + n] = _rotate(k.transpose(1, 2), cos, sin)
            v_cache[li][:, :, start: start + n] = v.view(b, n, n_kv, head_dim).transpose(1, 2)
            keys, values = k_cache[li][:, :, : start + n], v_cache[li][:, :, : start + n]
            if n > 1:  # prefill: SDPA's fused kernel, no [b, H, n, S] float32 scores in memory
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed[:, None],
                                                     scale=layer.scaling, enable_gqa=True)
            else:  # one query row: two small matmuls beat SDPA's CPU kernel (see the module docstring)
                # query head h reads kv head h // group (HF's repeat_kv), so group the queries
                scores = (q.reshape(b, n_kv, group * n, head_dim) @ keys.transpose(-1, -2)).float()
                scores = scores.mul_(layer.scaling).view(b, n_kv, group, n, -1) + bias
                out = scores.softmax(-1).to(dtype).view(b, n_kv, group * n, -1) @ values
            out = out.view(b, n_heads, n, head_dim).transpose(1, 2).reshape(b, n, -1)
            h = h + F.linear(out, layer.o, layer.o_bias)
            gate, up = F.linear(layer.post_norm(h), layer.gate_up).chunk(2, dim=-1)
            h = h + F.linear(layer.act(gate) * up, layer.down)
            if li in order:  # HF's hidden_states[num_layers] is after the final norm
                feats[li] = h if li < num_layers - 1 else inner.norm(h)
        logits = model.lm_head(inner.norm(h[:, -1]))
        return logits, torch.cat([feats[lid] for lid in layer_ids], dim=-1)

    logits, prompt_feats = step(ids, 0)
    responses: list[list[int]] = [[] for _ in range(bs)]
    chunks = [[prompt_feats[i, int(pads[i]):].to(torch.bfloat16).cpu()] for i in range(bs)]
    results: list[tuple[list[int], Tensor] | None] = [None] * bs
    slot = list(range(bs))  # slot[r]: the prompt in cache row r (-1: finished, row is dead)
    for t in range(max_new_tokens):
        nxt = logits.argmax(-1)
        for r, (i, tok) in enumerate(zip(slot, nxt.tolist())):
            if i >= 0:
                responses[i].append(tok)
        logits, f = step(nxt[:, None], width + t)  # features of the tokens just chosen
        f = f[:, 0].to(torch.bfloat16).cpu()
        for r, i in enumerate(slot):
            if i < 0:
                continue
            chunks[i].append(f[r: r + 1])
            if responses[i][-1] in eos_ids or len(responses[i]) == max_new_tokens:
                results[i] = (responses[i], torch.cat(chunks[i]))
                chunks[i], slot[r] = [], -1
        live = [r for r, i in enumerate(slot) if i >= 0]
        if not live:
            break
        if len(live) <= 0.75 * len(slot):  # drop dead rows: later steps compute and read less
            keep = torch.tensor(live, device=dev)
            k_cache[:] = [k[keep] for k in k_cache]
            v_cache[:] = [v[keep] for v in v_cache]
            pads, logits = pads[keep], logits[keep]
            slot = [slot[r] for r in live]
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:  # cannot happen: every row ends by EOS or at max_new_tokens
        raise RuntimeError(f"greedy_with_features: prompts {missing} did not finish")
    return results  # type: ignore[return-value]
