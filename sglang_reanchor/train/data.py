"""The self-distillation training set: target responses and their cached features.

`build_dataset` turns prompts into target-generated responses (chat template applied,
greedy, batched with left padding, capped at ``max_new_tokens``) and caches the
drafter's context features of each ``prompt + response``, ``hidden_states[l + 1]`` for
``l`` in ``layer_ids``, concatenated and stored in bfloat16. New responses and their
features come out of one pass (`batch_greedy.greedy_with_features`, ~2.3x Hugging
Face ``generate`` alone on these CPUs); stored responses (a pack) get their features
from one forward over each ``prompt + response`` (`target_features`).

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

import bisect
import hashlib
import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .batch_greedy import greedy_with_features
from .prompts import Prompt

__all__ = ["Sequences", "build_dataset", "chat_ids", "load_sequences", "mapped_tensor", "prompt_key", "prompt_texts",
           "read_pack", "target_features", "write_pack"]


@dataclass
class Sequences:
    """All training sequences in memory (the concatenated shards); shapes as on disk."""

    input_ids: Tensor  # [N] int64
    offsets: Tensor  # [n + 1] int64
    prompt_lens: Tensor  # [n] int64
    features: Tensor  # [N, K*H] bfloat16 (memory-mapped rows from `load_sequences`)

    def __len__(self) -> int:
        return self.prompt_lens.shape[0]

    def get(self, i: int) -> tuple[Tensor, int, Tensor]:
        """Sequence ``i``: token ids ``[T]``, prompt length, features ``[T, K*H]``."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.input_ids[a:b], int(self.prompt_lens[i]), self.features[a:b]

    def batch(self, indices: Sequence[int], dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Sequences ``indices`` right-padded: ids ``[bs, T]`` long (0 past the end),
        features ``[bs, T, K*H]`` in ``dtype`` (0 past the end), seq_lens ``[bs]``,
        prompt_lens ``[bs]``; ``T`` is the longest of them."""
        items = [self.get(i) for i in indices]
        width = max(x.shape[0] for x, _, _ in items)
        ids = torch.zeros(len(items), width, dtype=torch.long)
        feats = torch.zeros(len(items), width, self.features.shape[1], dtype=dtype)
        for r, (x, _, f) in enumerate(items):
            ids[r, : x.shape[0]] = x
            feats[r, : x.shape[0]] = f.to(dtype)
        return (ids, feats, torch.tensor([x.shape[0] for x, _, _ in items]),
                torch.tensor([p for _, p, _ in items]))


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
                  batch_size: int = 16, num_val: int = 16, extra_meta: dict | None = None,
                  max_prompt_tokens: int = 512, sort_window: int = 1,
                  known_responses: dict[str, list[int]] | None = None) -> Path:
    """Generate responses for ``prompts`` (the first ``num_val`` held out for
    validation) and write the shards described in the module docstring.

    ``known_responses`` (`prompt_key` -> response ids, from `read_pack`): prompts with
    a stored response come first, and a batch whose responses are all known is not
    generated, only its features are computed (one forward per sequence instead of one
    per new token). Resume such a build with the same pack."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    val, train = list(prompts[:num_val]), list(prompts[num_val:])
    for name, items in (("val_prompts.jsonl", val), ("prompts.jsonl", train)):
        (out / name).write_text("".join(json.dumps(asdict(p)) + "\n" for p in items))
    eos_ids = {int(tokenizer.eos_token_id)} | set(_as_list(model.generation_config.eos_token_id))
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    tokenised = [chat_ids(tokenizer, p.text) for p in train]
    # prompts keep their (shuffled, domain-mixed) order at the scale of `sort_window`, so a
    # partial build is a fair sample; inside a window they are sorted by length, so a
    # batch wastes little on left padding. Prompts over `max_prompt_tokens` are skipped.
    kept = [i for i, t in enumerate(tokenised) if len(t) <= max_prompt_tokens]
    order = [i for w in range(0, len(kept), sort_window)
             for i in sorted(kept[w: w + sort_window], key=lambda i: len(tokenised[i]))]
    if known_responses:  # stored responses first: their batches need no generation at all
        known = [prompt_key(train[i].text) in known_responses for i in order]
        order = [i for i, k in zip(order, known) if k] + [i for i, k in zip(order, known) if not k]
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    meta = {"layer_ids": list(layer_ids), "max_new_tokens": max_new_tokens, "batch_size": batch_size,
            "max_prompt_tokens": max_prompt_tokens, "sort_window": sort_window,
            "num_train_prompts": len(train), "num_val_prompts": len(val),
            "eos_ids": sorted(eos_ids), "pad_id": pad_id, **(extra_meta or {})}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    for b, idx in enumerate(tqdm(batches, desc="generate", unit="batch")):
        path = out / f"shard_{b:05d}.safetensors"
        if path.exists():
            continue  # resumed build
        prompt_ids = [tokenised[i] for i in idx]
        keys = [prompt_key(train[i].text) for i in idx]
        if known_responses is not None and all(k in known_responses for k in keys):
            responses = [list(known_responses[k]) for k in keys]
            feats = target_features(model, [p + r for p, r in zip(prompt_ids, responses, strict=True)],
                                    layer_ids, pad_id)
        else:  # one pass: the features come out of the decoding steps themselves
            got = greedy_with_features(model, prompt_ids, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                                       layer_ids=layer_ids, pad_id=pad_id)
            responses, feats = [r for r, _ in got], [f for _, f in got]
        seqs = [p + r for p, r in zip(prompt_ids, responses, strict=True)]
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


def prompt_key(text: str) -> str:
    """A prompt's identity in a pack: the first 16 hex digits of its text's SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_pack(data_dirs: Sequence[str | Path], path: str | Path) -> dict[str, int]:
    """Store the generated responses of data folders compactly (no prompt text, no
    features): per sequence the `prompt_key` of its prompt and its response ids
    (uint16 when the vocabulary allows), ``np.savez_compressed``. A later build with the
    same prompt pool reads it back (`read_pack`, ``data --pack``) and only recomputes
    the features. Returns counts."""
    import numpy as np

    keys, responses = [], []
    for d in data_dirs:
        texts = [json.loads(line)["text"] for line in (Path(d) / "prompts.jsonl").read_text().splitlines()
                 if line.strip()]
        for shard in sorted(Path(d).glob("shard_*.safetensors")):
            with safe_open(str(shard), framework="pt") as f:
                index = json.loads(f.metadata()["prompt_index"])
                ids, offs, plens = f.get_tensor("input_ids"), f.get_tensor("offsets"), f.get_tensor("prompt_lens")
            for k, i in enumerate(index):
                keys.append(prompt_key(texts[i]))
                responses.append(ids[int(offs[k]) + int(plens[k]): int(offs[k + 1])].tolist())
    flat = [t for r in responses for t in r]
    dtype = np.uint16 if max(flat, default=0) < 2**16 else np.int32
    lens = np.array([len(r) for r in responses], dtype=np.int64)
    np.savez_compressed(path, keys=np.array(keys), ids=np.array(flat, dtype=dtype),
                        offsets=np.concatenate([[0], np.cumsum(lens)]))
    return {"responses": len(responses), "tokens": len(flat)}


def read_pack(path: str | Path) -> dict[str, list[int]]:
    """`prompt_key` -> response ids, from `write_pack`'s file."""
    import numpy as np

    z = np.load(path)
    ids, offs = z["ids"].astype(np.int64), z["offsets"]
    return {str(k): ids[offs[i]: offs[i + 1]].tolist() for i, k in enumerate(z["keys"])}


def _as_list(x: int | list[int] | None) -> list[int]:
    return [] if x is None else ([x] if isinstance(x, int) else list(x))


def load_sequences(*data_dirs: str | Path) -> Sequences:
    """Concatenate every shard of each of ``data_dirs`` (dirs in the order given, shards
    in name order) into one `Sequences`; the dirs must share ``meta.json["layer_ids"]``.

    Token ids are read into memory; the features (the bulk: ``K*H`` bfloat16 per token,
    9 GB for 2M tokens of SmolLM2) stay memory-mapped in their shard files and are read
    row by row as batches need them."""
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
        with safe_open(str(path), framework="pt") as f:
            ids.append(f.get_tensor("input_ids").long())
            shard_offsets = f.get_tensor("offsets")
            plens.append(f.get_tensor("prompt_lens"))
        offs.append(shard_offsets[1:] + base)
        base += int(shard_offsets[-1])
        feats.append(mapped_tensor(path, "features"))
    return Sequences(torch.cat(ids), torch.cat(offs), torch.cat(plens), _Rows(feats))


def mapped_tensor(path: str | Path, name: str) -> Tensor:
    """Tensor ``name`` of a safetensors file, memory-mapped read-only (no copy).

    The format is an 8-byte little-endian header size, a JSON header giving each
    tensor's dtype, shape and byte range, then the raw bytes."""
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        info = json.loads(fh.read(size))[name]
    dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I32": torch.int32,
             "I64": torch.int64}[info["dtype"]]
    begin, end = info["data_offsets"]
    return _mmap(path, 8 + size + begin, (end - begin) // dtype.itemsize, dtype).view(*info["shape"])


def _mmap(path: str | Path, offset: int, count: int, dtype: torch.dtype) -> Tensor:
    import numpy as np

    raw = np.memmap(path, dtype={2: np.int16, 4: np.int32, 8: np.int64}[dtype.itemsize], mode="r",
                    offset=offset, shape=(count,))
    with warnings.catch_warnings():  # read-only map: torch warns it cannot write; nothing writes
        warnings.simplefilter("ignore")
        return torch.from_numpy(raw).view(dtype)


class _Rows:
    """Row-concatenation of 2-D tensors that supports ``rows[a:b]`` (one contiguous
    slice that lies inside one part, as every sequence does) and ``.shape``."""

    def __init__(self, parts: list[Tensor]) -> None:
        self.parts = parts
        self.starts = [0]
        for p in parts:
            self.starts.append(self.starts[-1] + p.shape[0])
        self.shape = torch.Size([self.starts[-1], *parts[0].shape[1:]])

    def __getitem__(self, rows: slice) -> Tensor:
        k = bisect.bisect_right(self.starts, rows.start) - 1
        lo = self.starts[k]
        if rows.stop > self.starts[k + 1]:
            raise IndexError(f"rows {rows.start}:{rows.stop} span two shards")
        return self.parts[k][rows.start - lo: rows.stop - lo]


def prompt_texts(data_dir: str | Path) -> set[str]:
    """Texts of every prompt (training and held-out) a data folder was built from."""
    texts: set[str] = set()
    for name in ("prompts.jsonl", "val_prompts.jsonl"):
        path = Path(data_dir) / name
        if path.exists():
            texts |= {json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()}
    return texts
