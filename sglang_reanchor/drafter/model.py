"""The DFlash block-diffusion drafter, compatible with z-lab ``DFlashDraftModel`` weights.

A DFlash drafter has no embedding and no LM head: it borrows the target's. Target hidden
states from ``target_layer_ids`` (HF ``hidden_states[l + 1]``) are concatenated to
``[bs, C, K*H]``, projected by ``fc`` + ``hidden_norm`` and injected into every layer
as extra keys/values (`project_context`). The queries are the target embeddings of a
block ``[anchor, MASK x (B-1)]``; each layer is a Qwen3 pre-norm block (per-head
q/k RMSNorm, GQA, RoPE, SwiGLU) whose attention is non-causal over
``[context keys | the queries' own keys]``. Glossary: ``bs`` batch, ``Q`` query tokens,
``C`` context positions, ``H`` hidden size, ``K`` target layers, ``B`` block size.

Reference semantics: z-lab/dflash ``dflash/model.py`` (``Qwen3DFlashAttention``,
``DFlashDraftModel.forward``). Parameter names equal z-lab's, so checkpoints load
with no renaming and without ``trust_remote_code``.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from .config import DFlashConfig
from .context import ContextKV
from .draft_vocab import save_draft_vocab
from .heads import ARGMAX_HEAD, DraftHead

__all__ = ["DFlashDrafter", "RMSNorm", "RotaryEmbedding"]


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, computed in at least float32 (as HF Qwen3RMSNorm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Default (unscaled) RoPE; ``inv_freq`` is a non-persistent float32 buffer."""

    inv_freq: Tensor

    def __init__(self, head_dim: int, theta: float, device: torch.device | None = None) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", self.compute_inv_freq(device), persistent=False)

    def compute_inv_freq(self, device: torch.device | str | None = None) -> Tensor:
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device)
        return 1.0 / (self.theta ** (exponents.float() / self.head_dim))

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        super()._apply(fn, recurse)
        # `.to(bfloat16)` would round inv_freq and skew angles at long positions
        if self.inv_freq.dtype != torch.float32 and self.inv_freq.device.type != "meta":
            self.inv_freq = self.compute_inv_freq(self.inv_freq.device)
        return self

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin ``[bs, 1, N, head_dim]`` for positions ``[bs, N]`` (angles in float32)."""
        angles = positions[..., None].float() * self.inv_freq  # [bs, N, head_dim/2]
        emb = torch.cat([angles, angles], dim=-1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Apply RoPE to ``x [bs, heads, N, head_dim]`` (rotate-half convention, as HF)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DFlashAttention(nn.Module):
    """Qwen3 attention whose keys/values are ``[context | own tokens]``; non-causal."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        h, d, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, d)
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)

    def key_value(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Rotated, normed keys and values ``[bs, num_kv_heads, N, head_dim]`` of ``x [bs, N, H]``."""
        bs, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(bs, n, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(bs, n, self.num_kv_heads, self.head_dim)
        return _rotate(k.transpose(1, 2), cos, sin), v.transpose(1, 2)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, context: tuple[Tensor, Tensor] | None,
                mask: Tensor | None) -> Tensor:
        """``x [bs, Q, H]``, ``mask [bs, 1, Q, C+Q]`` bool (True = attend) -> ``[bs, Q, H]``."""
        bs, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(bs, q_len, self.num_heads, self.head_dim))
        q = _rotate(q.transpose(1, 2), cos, sin)  # [bs, heads, Q, d]
        k, v = self.key_value(x, cos, sin)
        if context is not None:
            # the same k_proj/v_proj/k_norm made the context K/V (see project_context)
            k = torch.cat([context[0].expand(bs, -1, -1, -1), k], dim=2)
            v = torch.cat([context[1].expand(bs, -1, -1, -1), v], dim=2)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=self.head_dim**-0.5,
            enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(bs, q_len, -1))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))``. Context skips the norms."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, context: tuple[Tensor, Tensor] | None,
                mask: Tensor | None) -> Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, context, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """DFlash drafter (z-lab ``DFlashDraftModel`` weights, no embedding, no LM head).

    Parameters
    ----------
    config : DFlashConfig
        Sizes and DFlash settings. Only ``full_attention`` layers are implemented
        (every released Qwen3/LLaMA drafter); ``sliding_attention`` raises.

    ``head`` rolls a block's hidden states out into drafts (`heads.ArgmaxHead` here;
    the Domino and DSpark subclasses, `domino.DominoDrafter` and
    `dspark.DSparkDrafter`, carry their own). `from_pretrained` returns the subclass
    the folder's ``config.json`` describes.
    """

    family = "dflash"  # "domino" / "dspark" in the subclasses
    family_name = "DFlash"

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        if any(config.layer_type(i) != "full_attention" for i in range(config.num_hidden_layers)):
            raise NotImplementedError(
                f"layer_types {list(config.layer_types or ())}: only 'full_attention' "
                "drafter layers are implemented")
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(config.num_context_features, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)
        # target tokens ranked by frequency in the training responses, when the folder
        # carries draft_vocab.safetensors (`draft_vocab.py`); only used when asked for
        self.vocab_ranking: Tensor | None = None
        # how a block's hidden states become drafts (`heads.py`): argmax for DFlash
        self.head: DraftHead = ARGMAX_HEAD
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """HF-style init: Linear ~ N(0, initializer_range), zero biases, unit norms."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=self.config.initializer_range)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.config.target_layer_ids

    # -- forward ------------------------------------------------------------------

    def project_context(self, features: Tensor, positions: Tensor) -> ContextKV:
        """Turn target features into per-layer context K/V.

        Parameters
        ----------
        features : Tensor
            ``[bs, C, K*H]``, target ``hidden_states[l + 1]`` concatenated over
            ``target_layer_ids`` (in that order).
        positions : Tensor
            ``[bs, C]`` long, the absolute positions of the context rows.

        Returns
        -------
        ContextKV
            Per layer, keys (k_proj -> k_norm -> RoPE) and values (v_proj), each
            ``[bs, num_kv_heads, C, head_dim]``.
        """
        if features.dim() != 3 or features.shape[-1] != self.config.num_context_features:
            raise ValueError(
                f"features must be [bs, C, K*H = {self.config.num_context_features}], "
                f"got {tuple(features.shape)}")
        if positions.shape != features.shape[:2] or positions.dtype != torch.long:
            raise ValueError(
                f"positions must be long [bs, C] = {tuple(features.shape[:2])}, "
                f"got {positions.dtype} {tuple(positions.shape)}")
        c = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        cos, sin = self.rotary_emb(positions, c.dtype)
        kvs = [layer.self_attn.key_value(c, cos, sin) for layer in self.layers]
        return ContextKV(keys=tuple(k for k, _ in kvs), values=tuple(v for _, v in kvs))

    def forward(self, query_embeds: Tensor, query_positions: Tensor, context: ContextKV | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """Run the drafter over query tokens (one or more blocks).

        Parameters
        ----------
        query_embeds : Tensor
            ``[bs, Q, H]``, target embeddings of the query tokens (anchor / MASK).
        query_positions : Tensor
            ``[bs, Q]`` long, their absolute positions.
        context : ContextKV or None
            Context K/V, each ``[1 or bs, num_kv_heads, C, head_dim]`` (batch 1 is
            broadcast); None means ``C = 0``.
        attention_mask : Tensor or None
            ``[bs, Q, C+Q]`` bool, True = attend. Key order: the ``C`` context keys,
            then the ``Q`` query tokens' own keys. Every query must see at least one
            key. None = every query sees every key (one plain DFlash block).

        Returns
        -------
        Tensor
            ``[bs, Q, H]`` hidden states after the final norm (feed the target's
            ``lm_head``; slot 0 of a block is the anchor and is not a draft).
        """
        bs, q_len, hidden = query_embeds.shape
        c_len = 0 if context is None else context.length
        if hidden != self.config.hidden_size or query_positions.shape != (bs, q_len):
            raise ValueError(
                f"query_embeds must be [bs, Q, H={self.config.hidden_size}] and "
                f"query_positions [bs, Q]; got {tuple(query_embeds.shape)} and "
                f"{tuple(query_positions.shape)}")
        if context is not None and len(context.keys) != len(self.layers):
            raise ValueError(f"context has {len(context.keys)} layers, drafter has {len(self.layers)}")
        mask = None
        if attention_mask is not None:
            if attention_mask.dtype != torch.bool or attention_mask.shape != (bs, q_len, c_len + q_len):
                raise ValueError(
                    f"attention_mask must be bool [bs, Q, C+Q] = {(bs, q_len, c_len + q_len)}, "
                    f"got {attention_mask.dtype} {tuple(attention_mask.shape)}")
            if not bool(attention_mask.any(-1).all()):
                raise ValueError("attention_mask has a query row that attends to nothing")
            mask = attention_mask[:, None]  # broadcast over heads
        h = query_embeds.to(self.norm.weight.dtype)
        cos, sin = self.rotary_emb(query_positions, h.dtype)
        for i, layer in enumerate(self.layers):
            ctx = None if context is None else (context.keys[i], context.values[i])
            h = layer(h, cos, sin, ctx, mask)
        return self.norm(h)

    # -- compatibility with a target ----------------------------------------------------

    def validate_target(self, target_config: Any, *, strict: bool = False) -> None:
        """Check that this drafter fits a target (an HF ``PretrainedConfig``).

        Raises ``ValueError`` naming the field for: hidden size mismatch (the drafter
        borrows the target's embeddings and lm_head; ``fc`` takes ``K * target hidden``),
        ``mask_token_id`` outside ``[0, target vocab_size)``, a target layer id outside
        ``[0, num_hidden_layers - 1]``. A ``num_target_layers`` mismatch only warns
        (``strict=True``: raises): the features are still well defined, but the drafter
        was trained on a target of another depth, so acceptance will likely suffer.
        """
        cfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        own = self.config
        if own.hidden_size != cfg.hidden_size:
            raise ValueError(
                f"hidden_size: drafter has {own.hidden_size}, target has {cfg.hidden_size}; "
                "they must be equal")
        want_in = len(own.target_layer_ids) * cfg.hidden_size
        if self.fc.in_features != want_in:
            raise ValueError(
                f"fc.weight: input size {self.fc.in_features} != len(target_layer_ids) * "
                f"target hidden_size = {want_in}")
        if not 0 <= own.mask_token_id < cfg.vocab_size:
            raise ValueError(
                f"mask_token_id={own.mask_token_id} must be in [0, target vocab_size="
                f"{cfg.vocab_size})")
        bad = [i for i in own.target_layer_ids if not 0 <= i < cfg.num_hidden_layers]
        if bad:
            raise ValueError(
                f"target_layer_ids {list(own.target_layer_ids)}: {bad} outside "
                f"[0, num_hidden_layers - 1 = {cfg.num_hidden_layers - 1}] of the target")
        if own.num_target_layers is not None and own.num_target_layers != cfg.num_hidden_layers:
            msg = (f"num_target_layers: drafter was built for {own.num_target_layers} target "
                   f"layers, target has {cfg.num_hidden_layers}")
            if strict:
                raise ValueError(msg)
            warnings.warn(msg, UserWarning, stacklevel=2)

    # -- checkpoints --------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str | Path, device: torch.device | str | None = None,
                        dtype: torch.dtype | None = None) -> DFlashDrafter:
        """Load a drafter folder: ``config.json`` + ``model.safetensors`` (or sharded
        ``model.safetensors.index.json``). No remote code. Strict: missing, unexpected
        or mis-shaped tensors raise ``ValueError`` listing them. ``dtype`` defaults to
        the config's ``dtype``; the model is returned in eval mode.

        The family comes from ``config.json`` (`families.drafter_family`): a z-lab
        DFlash folder gives a `DFlashDrafter`, a Domino one (``projector_type:
        "domino"``) a `DominoDrafter`, a DSpark one (``Qwen3DSparkModel``) a
        `DSparkDrafter`, each in the format SGLang 0.5.23 loads.
        """
        from .checkpoint import load_checkpoint  # (they import this module)
        from .families import drafter_class

        path = Path(path)
        raw = json.loads((path / "config.json").read_text())
        klass = drafter_class(raw)
        if not issubclass(klass, cls):
            raise ValueError(f"{path}: config.json describes a {klass.family_name} drafter, not a "
                             f"{cls.family_name} one; load it with DFlashDrafter.from_pretrained")
        return load_checkpoint(klass, path, raw, device, dtype)

    # hooks of the family subclasses (the DFlash versions change nothing)

    @classmethod
    def _from_raw(cls, raw: dict[str, Any]) -> DFlashDrafter:
        """A model (on the current default device) for a ``config.json`` dict."""
        return cls(DFlashConfig.from_dict(raw))

    def _checkpoint_tensors(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """The checkpoint's tensors under this model's names (renamed / skipped ones)."""
        return tensors

    def _drop_absent_optional(self, names: set[str]) -> None:
        """Remove optional modules whose tensors are all absent from ``names``."""

    def config_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict `save_pretrained` writes."""
        return dataclasses.replace(self.config, dtype=str(self.fc.weight.dtype)).to_dict()

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``config.json`` + ``model.safetensors`` in the z-lab format (the family's
        SGLang format for the Domino and DSpark subclasses)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        config = self.config_dict()
        (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        if self.vocab_ranking is not None:
            save_draft_vocab(path, self.vocab_ranking)

