"""Tiny random models for tests (a helper module, not a test file).

``tiny_target`` builds a random HF causal LM of the Llama or Qwen3 family;
``tiny_drafter`` a random DFlash drafter that fits it. Both are seeded, in eval mode,
float64 by default so oracle comparisons can use tight tolerances.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

from sglang_reanchor.drafter import (
    DFlashConfig,
    DFlashDrafter,
    DominoDrafter,
    DominoSettings,
    DSparkDrafter,
    DSparkSettings,
)

__all__ = ["char_tokenizer", "tiny_domino_drafter", "tiny_drafter", "tiny_dspark_drafter", "tiny_target",
           "write_zlab_drafter"]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def tiny_target(
    family: Literal["llama", "qwen3"],
    *,
    vocab_size: int = 32,
    hidden_size: int = 32,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    attn_implementation: str = "sdpa",
    tie_word_embeddings: bool | None = None,
) -> PreTrainedModel:
    """A random ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` in eval mode.

    Token ids: pad 0, bos 1, eos 2. Embeddings are untied for "llama" (as
    Llama-3.1-8B) and tied for "qwen3" (as Qwen3-4B) unless ``tie_word_embeddings``
    says otherwise. Weights use std 0.1 (not HF's 0.02) so greedy argmaxes are not
    near-ties.
    """
    common = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, max_position_embeddings=512,
        pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, initializer_range=0.1,
        tie_word_embeddings=(family == "qwen3") if tie_word_embeddings is None else tie_word_embeddings,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if family == "llama":
            config = LlamaConfig(**common, rms_norm_eps=1e-5)
            model: PreTrainedModel = LlamaForCausalLM(config)
        elif family == "qwen3":
            config = Qwen3Config(**common, head_dim=hidden_size // num_heads, rms_norm_eps=1e-6)
            model = Qwen3ForCausalLM(config)
        else:
            raise ValueError(f"family must be 'llama' or 'qwen3', got {family!r}")
    model.config._attn_implementation = attn_implementation
    return model.to(dtype).eval()


def tiny_drafter(
    target: PreTrainedModel,
    *,
    block_size: int = 8,
    num_layers: int = 1,
    seed: int = 0,
    mask_token_id: int | None = None,
    target_layer_ids: list[int] | None = None,
    dtype: torch.dtype | None = None,
) -> DFlashDrafter:
    """A random drafter fitting ``target`` (eval mode, ``dtype`` defaults to the target's).

    ``mask_token_id`` defaults to the last vocab row. Norm weights are randomised too
    (1 + 0.1 N(0, 1)), so a misplaced norm shows up in tests.
    """
    cfg = target.config
    config = DFlashConfig.for_target(
        cfg, num_layers=num_layers, block_size=block_size, target_layer_ids=target_layer_ids,
        mask_token_id=cfg.vocab_size - 1 if mask_token_id is None else mask_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        drafter = DFlashDrafter(config)
        with torch.no_grad():
            for name, p in drafter.named_parameters():
                if name.endswith("norm.weight"):
                    p.add_(0.1 * torch.randn_like(p))
                else:
                    p.normal_(0.0, 0.2)
    return drafter.to(dtype or target.dtype).eval()


def _with_random_head(family: DFlashDrafter, base: DFlashDrafter, seed: int, scales: dict[str, float]) -> DFlashDrafter:
    """``family`` (a fresh family drafter) with ``base``'s backbone and random head weights:
    parameters whose name starts with a key of ``scales`` ~ N(0, scale)."""
    family = family.to(base.fc.weight.dtype)
    missing, unexpected = family.load_state_dict(base.state_dict(), strict=False)
    assert not unexpected and all(k.startswith(tuple(scales)) for k in missing), (missing, unexpected)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(10_000 + seed)
        with torch.no_grad():
            for name, p in family.named_parameters():
                for prefix, scale in scales.items():
                    if name.startswith(prefix):
                        p.normal_(0.0, scale)
    return family.eval()


def tiny_domino_drafter(target: PreTrainedModel, *, block_size: int = 8, num_layers: int = 1, seed: int = 0,
                        shift_label: bool = True, gru_hidden_dim: int = 8, emb_dim: int = 16,
                        mask_token_id: int | None = None, target_layer_ids: list[int] | None = None,
                        dtype: torch.dtype | None = None) -> DominoDrafter:
    """A random Domino drafter fitting ``target``: `tiny_drafter`'s backbone (same seed) plus a
    random GRU correction head, scaled so that the correction often changes the argmax."""
    base = tiny_drafter(target, block_size=block_size, num_layers=num_layers, seed=seed, mask_token_id=mask_token_id,
                        target_layer_ids=target_layer_ids, dtype=dtype)
    settings = DominoSettings(shift_label=shift_label, gru_hidden_dim=gru_hidden_dim, emb_dim=emb_dim)
    return _with_random_head(DominoDrafter(base.config, settings), base, seed,
                             {"prefix_gru.": 0.4, "embed_proj.0.": 0.3, "embed_proj.2.": 0.3})


def tiny_dspark_drafter(target: PreTrainedModel, *, block_size: int = 8, num_layers: int = 1, seed: int = 0,
                        markov_head_type: str = "vanilla", markov_rank: int = 4, sample_from_anchor: bool = True,
                        confidence_head: bool = True, mask_token_id: int | None = None,
                        target_layer_ids: list[int] | None = None, dtype: torch.dtype | None = None) -> DSparkDrafter:
    """A random DSpark drafter fitting ``target`` (``block_size`` is DSpark's gamma, the drafts per
    block): `tiny_drafter`'s backbone plus a random Markov head (and confidence head)."""
    base = tiny_drafter(target, block_size=block_size, num_layers=num_layers, seed=seed, mask_token_id=mask_token_id,
                        target_layer_ids=target_layer_ids, dtype=dtype)
    settings = DSparkSettings(markov_rank=markov_rank, markov_head_type=markov_head_type,
                              sample_from_anchor=sample_from_anchor, confidence_head=confidence_head)
    return _with_random_head(DSparkDrafter(base.config, settings), base, seed,
                             {"markov_head.markov_w1.": 1.0, "markov_head.markov_w2.": 0.4, "markov_head.gate_proj.": 0.4,
                              "markov_head.joint_proj.": 0.4, "confidence_head.": 0.3})


def write_zlab_drafter(drafter: DFlashDrafter, path: str | Path) -> Path:
    """Save ``drafter`` as a z-lab checkpoint folder; returns the folder."""
    drafter.save_pretrained(path)
    return Path(path)


# the characters of `char_tokenizer`'s ids 3, 4, ... (JSON, regexes and prose can be spelled with them)
CHARS = "abcdefghijklmnopqrstuvwxyz0123456789{}[]\":, .-_()+*=?!\n'/;<>"


# "role: content" lines, then "assistant: " (lower case: the tokenizer has no capitals)
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def char_tokenizer(vocab_size: int = 64):
    """A character-level Hugging Face tokenizer for the tiny models: one token per character.

    Ids ``0, 1, 2`` are ``<pad>``, ``<s>``, ``</s>`` (the tiny models' pad, bos, eos);
    ``3 .. vocab_size - 2`` are the first characters of ``CHARS``; the last id is ``<mask>``
    (the tiny drafters' mask token); a plain ``role: content`` chat template. With it an SGLang
    server can take text and chat messages, and its
    grammar backend can compile regexes and JSON schemas over the tiny vocabulary.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = CHARS[: vocab_size - 4]
    if len(chars) != vocab_size - 4:
        raise ValueError(f"vocab_size must be at most {len(CHARS) + 4}, got {vocab_size}")
    vocab = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID, **{c: 3 + i for i, c in enumerate(chars)},
             "<mask>": vocab_size - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<pad>", mask_token="<mask>")
    out.chat_template = CHAT_TEMPLATE
    return out


def random_sequences(target: torch.nn.Module, n: int = 6, seed: int = 0, dtype: torch.dtype | None = None):
    """``n`` random prompt + response sequences with ``target``'s real features (layers 1, 2), as
    the training data folders hold them (`train.data.Sequences`); features cast to ``dtype``."""
    from sglang_reanchor.train.data import Sequences, target_features

    g = torch.Generator().manual_seed(seed)
    seqs, plens = [], []
    for _ in range(n):
        p = int(torch.randint(3, 8, (1,), generator=g))
        t = int(torch.randint(p + 4, p + 30, (1,), generator=g))
        seqs.append(torch.randint(3, 32, (t,), generator=g).tolist())
        plens.append(p)
    feats = [f if dtype is None else f.to(dtype) for f in target_features(target, seqs, (1, 2), PAD_ID)]
    lens = torch.tensor([len(s) for s in seqs])
    return Sequences(torch.tensor([x for s in seqs for x in s]),
                     torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
                     torch.tensor(plens), torch.cat(feats))
