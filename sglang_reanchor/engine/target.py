"""The verifier: a Hugging Face causal LM run over draft trees, with its KV cache.

`TargetModel` owns the three things speculative decoding needs from the target:
a forward over new tokens at given positions under a given mask (prefill, a
chain, or a tree), the drafter's features from that same forward
(``hidden_states[l + 1]`` for each ``l`` in the drafter's ``target_layer_ids``),
and compaction of the KV cache to the accepted path (a gather, since accepted
tree nodes need not be contiguous).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

__all__ = ["TargetModel", "TargetOutput"]


@dataclass(frozen=True)
class TargetOutput:
    logits: Tensor  # [1, n, V] in the model's dtype (argmax is exact in it; sampling upcasts)
    features: Tensor | None  # [1, n, K*H]: concatenated hidden_states[l + 1]; None when not asked


class TargetModel:
    """A causal LM with a cache, forwarded over prompts, single tokens and trees.

    Parameters
    ----------
    model:
        A Hugging Face ``*ForCausalLM`` (Llama and Qwen3 families are tested) with
        full attention in every layer.
    layer_ids:
        Target layers whose outputs feed the drafter (``target_layer_ids``).
    """

    def __init__(self, model: PreTrainedModel, layer_ids: tuple[int, ...] = ()) -> None:
        cfg = model.config
        num_layers = cfg.num_hidden_layers
        bad = [lid for lid in layer_ids if not 0 <= lid < num_layers]
        if bad:
            raise ValueError(f"target_layer_ids {bad} are outside [0, {num_layers - 1}] for a {num_layers}-layer target")
        if getattr(cfg, "use_sliding_window", False) or any(
            t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ())
        ):
            raise ValueError("the reference engine supports targets with full attention in every layer only")
        self.model = model.eval()
        self.layer_ids = tuple(layer_ids)
        # transformers renamed `past_key_values` to `cache` during 5.x; accept both.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        cache: DynamicCache,
        tree_mask: Tensor | None = None,
        *,
        features: bool = True,
        last_only: bool = False,
    ) -> TargetOutput:
        """Run ``input_ids`` (``[1, n]``) at ``positions`` (``[1, n]``) after the cached prefix.

        ``tree_mask`` (``[n, n]`` bool, True = attend) restricts attention among the
        new tokens (a tree's ancestor relation); None means causal. Every new token
        sees the whole cached prefix. The cache grows by ``n``.
        """
        prefix = cache.get_seq_length()
        mask = None
        if tree_mask is not None:
            n = input_ids.shape[1]
            allowed = torch.cat(
                [torch.ones(n, prefix, dtype=torch.bool, device=tree_mask.device), tree_mask], dim=1
            )
            # An additive float mask works for both the SDPA and the eager attention paths.
            mask = torch.zeros(1, 1, n, prefix + n, dtype=self.dtype, device=self.device)
            mask.masked_fill_(~allowed.to(self.device), torch.finfo(self.dtype).min)
        out = self.model(
            input_ids=input_ids.to(self.device),
            position_ids=positions.to(self.device),
            attention_mask=mask,
            use_cache=True,
            output_hidden_states=features and bool(self.layer_ids),
            logits_to_keep=1 if last_only else 0,
            **{self._cache_kwarg: cache},
        )
        feats = None
        if features and self.layer_ids:
            hidden = out.hidden_states
            feats = torch.cat([hidden[lid + 1] for lid in self.layer_ids], dim=-1)
        # no float32 copy of [n, V]: greedy picks are the same in bf16, and `target_probs` upcasts
        return TargetOutput(logits=out.logits, features=feats)

    @staticmethod
    def keep_tokens(cache: DynamicCache, prefix: int, keep: Tensor) -> None:
        """Compact the cache to ``[0, prefix)`` plus the new entries ``prefix + keep``.

        ``keep``: ``[T]`` long, increasing offsets into the entries after ``prefix``
        (the accepted tree path). A contiguous ``0..T-1`` (a chain) is a slice.
        Layers are edited directly, which behaves the same on every transformers
        5.x release (``DynamicCache.crop`` changed its argument's meaning in 5.x).
        """
        t = keep.shape[0]
        contiguous = bool((keep.cpu() == torch.arange(t)).all())
        for layer in cache.layers:
            if type(layer) is not DynamicLayer:
                raise TypeError(f"cannot compact a {type(layer).__name__}; only full-attention DynamicLayer caches")
            assert layer.keys is not None and layer.values is not None  # a layer holding the prefix
            if contiguous:
                layer.keys = layer.keys[..., : prefix + t, :]
                layer.values = layer.values[..., : prefix + t, :]
                continue
            dev = layer.keys.device
            idx = torch.cat([torch.arange(prefix, device=dev), prefix + keep.to(dev)])
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)
