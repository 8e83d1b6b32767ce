"""The self-distillation training set: target responses and their cached features.

`build_dataset` turns prompts into target-generated responses (chat template applied,
greedy, batched with left padding, capped at ``max_new_tokens``), then runs the target
once more over each ``prompt + response`` (right padding: causal attention keeps the
valid rows exact) to cache the drafter's context features, ``hidden_states[l + 1]``
for ``l`` in ``layer_ids``, concatenated and stored in bfloat16.

On disk (``out/``): ``meta.json`` (settings, layer ids, target, counts),
``prompts.jsonl`` / ``val_prompts.jsonl`` (training / held-out prompts with sources)
and shards ``shard_00000.safetensors`` ... holding, for ``n`` sequences of ``T_i``
tokens (``N = sum T_i``):

- ``input_ids``: ``[N]`` int32, the sequences back to back,
- ``offsets``: ``[n + 1]`` int64, sequence ``i`` is ``input_ids[offsets[i]:offsets[i+1]]``,
- ``prompt_lens``: ``[n]`` int64, its prompt tokens (never labels),
- ``features``: ``[N, K*H]`` bfloat16.

A shard is written atomically once its batch is done, so an interrupted build resumes
where it stopped (existing shards are skipped). Several folders train together
(`load_sequences` takes many); ``data --exclude A`` builds a further one from prompts
not in ``A``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .prompts import Prompt

__all__ = ["Sequences", "build_dataset", "chat_ids", "load_sequences", "prompt_texts", "target_features"]


@dataclass
class Sequences:
    """All training sequences in memory (the concatenated shards); shapes as on disk."""

    input_ids: Tensor  # [N] int64
    offsets: Tensor  # [n + 1] int64
    prompt_lens: Tensor  # [n] int64
    features: Tensor  # [N, K*H] bfloat16

    def __len__(self) -> int:
        return self.prompt_lens.shape[0]

    def get(self, i: int) -> tuple[Tensor, int, Tensor]:
        """Sequence ``i``: token ids ``[T]``, prompt length, features ``[T, K*H]``."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.input_ids[a:b], int(self.prompt_lens[i]), self.features[a:b]


def chat_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of a one-turn chat prompt, ending with the assistant header."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                       add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


@torch.inference_mode()
def generate_responses(model: PreTrainedModel, prompts: Sequence[list[int]], *, max_new_tokens: int,
                       eos_ids: set[int], pad_id: int) -> list[list[int]]:
    """Greedy responses to a batch of tokenised prompts (left padding), each cut after
    its first EOS (kept: the drafter learns to predict the end too)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        attn[i, width - len(p):] = 1
    out = model.generate(input_ids=ids.to(model.device), attention_mask=attn.to(model.device),
                         max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_id,
                         eos_token_id=sorted(eos_ids))
    responses = []
    for row in out[:, width:].tolist():
        cut = next((j + 1 for j, t in enumerate(row) if t in eos_ids), len(row))
        responses.append(row[:cut])
    return responses


@torch.inference_mode()
def target_features(model: PreTrainedModel, seqs: Sequence[list[int]], layer_ids: Sequence[int],
                    pad_id: int) -> list[Tensor]:
    """Per sequence ``[T_i, K*H]`` bfloat16: concatenated ``hidden_states[l + 1]``.

    One forward over the right-padded batch; with causal attention the valid rows do
    not see the padding, so they equal an unpadded forward.
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
    out = model(input_ids=ids.to(model.device), attention_mask=attn.to(model.device),
                output_hidden_states=True, logits_to_keep=1)
    feats = torch.cat([out.hidden_states[lid + 1] for lid in layer_ids], dim=-1)  # [bs, W, K*H]
    return [feats[i, : len(s)].to(torch.bfloat16).cpu() for i, s in enumerate(seqs)]


def build_dataset(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt],
                  out: str | Path, *, layer_ids: Sequence[int], max_new_tokens: int = 256,
                  batch_size: int = 16, num_val: int = 16, extra_meta: dict | None = None) -> Path:
    """Generate responses for ``prompts`` (the first ``num_val`` held out for
    validation) and write the shards described in the module docstring."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    val, train = list(prompts[:num_val]), list(prompts[num_val:])
    for name, items in (("val_prompts.jsonl", val), ("prompts.jsonl", train)):
        (out / name).write_text("".join(json.dumps(asdict(p)) + "\n" for p in items))
    eos_ids = {int(tokenizer.eos_token_id)} | set(_as_list(model.generation_config.eos_token_id))
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    tokenised = [chat_ids(tokenizer, p.text) for p in train]
    # prompts stay in their (shuffled, domain-mixed) order, so a partial build is a fair
    # sample; left padding of short prompts costs little next to the decode steps
    order = list(range(len(tokenised)))
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    meta = {"layer_ids": list(layer_ids), "max_new_tokens": max_new_tokens, "batch_size": batch_size,
            "num_train_prompts": len(train), "num_val_prompts": len(val),
            "eos_ids": sorted(eos_ids), "pad_id": pad_id, **(extra_meta or {})}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    for b, idx in enumerate(tqdm(batches, desc="generate", unit="batch")):
        path = out / f"shard_{b:05d}.safetensors"
        if path.exists():
            continue  # resumed build
        prompt_ids = [tokenised[i] for i in idx]
        responses = generate_responses(model, prompt_ids, max_new_tokens=max_new_tokens,
                                       eos_ids=eos_ids, pad_id=pad_id)
        seqs = [p + r for p, r in zip(prompt_ids, responses, strict=True)]
        feats = target_features(model, seqs, layer_ids, pad_id)
        lens = torch.tensor([len(s) for s in seqs])
        shard = {
            "input_ids": torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
            "prompt_lens": torch.tensor([len(p) for p in prompt_ids], dtype=torch.long),
            "features": torch.cat(feats).contiguous(),
        }
        tmp = path.with_suffix(".tmp")
        save_file(shard, str(tmp), metadata={"prompt_index": json.dumps(idx)})
        os.replace(tmp, path)
    return out


def _as_list(x: int | list[int] | None) -> list[int]:
    return [] if x is None else ([x] if isinstance(x, int) else list(x))


def load_sequences(*data_dirs: str | Path) -> Sequences:
    """Concatenate every shard of each of ``data_dirs`` (dirs in the order given, shards
    in name order) into one `Sequences`; the dirs must share ``meta.json["layer_ids"]``."""
    if not data_dirs:
        raise ValueError("load_sequences: give at least one data folder")
    layer_ids = [json.loads((Path(d) / "meta.json").read_text())["layer_ids"] for d in data_dirs]
    if any(ids != layer_ids[0] for ids in layer_ids):
        raise ValueError(f"data folders {list(map(str, data_dirs))} cache different target layers "
                         f"(meta.json layer_ids {layer_ids}); their features cannot be mixed")
    shards = [path for d in data_dirs for path in sorted(Path(d).glob("shard_*.safetensors"))]
    if not shards:
        raise FileNotFoundError(f"{list(map(str, data_dirs))}: no shard_*.safetensors "
                                "(run the `data` command first)")
    ids, offs, plens, feats, base = [], [torch.zeros(1, dtype=torch.long)], [], [], 0
    for path in shards:
        s = load_file(str(path))
        ids.append(s["input_ids"].long())
        offs.append(s["offsets"][1:] + base)
        base += int(s["offsets"][-1])
        plens.append(s["prompt_lens"])
        feats.append(s["features"])
    return Sequences(torch.cat(ids), torch.cat(offs), torch.cat(plens), torch.cat(feats))


def prompt_texts(data_dir: str | Path) -> set[str]:
    """Texts of every prompt (training and held-out) a data folder was built from."""
    texts: set[str] = set()
    for name in ("prompts.jsonl", "val_prompts.jsonl"):
        path = Path(data_dir) / name
        if path.exists():
            texts |= {json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()}
    return texts
