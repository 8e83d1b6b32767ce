"""Bit packing of bool masks, in SGLang's and FlashInfer's exact orders (pure torch).

Two packed forms exist, and they differ:

* **SGLang QLEN_ONLY_BITPACKING** (:func:`pack_rows_to_words`): one unsigned word per
  query row; bit j of the word (value ``1 << j``) is key column j. The word is
  uint8 / uint16 / uint32 for N <= 8 / 16 / 32. Matched against
  ``build_tree_efficient_partial_packed`` in ``sgl-kernel/csrc/speculative/eagle_utils.cu``
  (``tree_mask[row * num_bytes_per_item + j / 8] |= 1 << (j % 8)``, bytes of a
  little-endian word) and the buffer allocation in
  ``sglang/srt/speculative/eagle_utils.py::build_tree_kernel_efficient``
  (``[torch.uint8, torch.uint16, torch.uint32][ceil(log2((N + 7) // 8))]``).
* **FlashInfer** (:func:`segment_packbits`): the flat bool mask of each request is
  packed separately, LSB first (``bitorder="little"``): element k of a segment goes to
  byte ``k // 8``, bit ``k % 8``; every segment starts on a fresh byte, so a request
  takes ``ceil(len / 8)`` bytes and ``mask_indptr`` counts bytes. Matched against
  ``flashinfer/quantization/packbits.py::segment_packbits`` and
  ``include/flashinfer/quantization.cuh`` (flashinfer-python 0.7.2.post1), and the
  reader ``include/flashinfer/attention/variants.cuh``:
  ``custom_mask_ptr = maybe_custom_mask + maybe_mask_indptr[batch]`` (a byte
  offset), then bit ``qo_idx * kv_len + kv_idx`` of that segment.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

__all__ = [
    "pack_rows_to_words",
    "segment_packbits",
    "segment_unpackbits",
    "sglang_word_dtype",
    "unpack_words_to_rows",
]

_WORD_DTYPES: tuple[tuple[int, torch.dtype], ...] = ((8, torch.uint8), (16, torch.uint16), (32, torch.uint32))


def sglang_word_dtype(num_cols: int) -> torch.dtype:
    """Word dtype SGLang uses for a packed row of ``num_cols`` tree nodes.

    Parameters
    ----------
    num_cols : int
        Tree size N, ``1 <= N <= 32``.

    Returns
    -------
    torch.dtype
        uint8 for N <= 8, uint16 for N <= 16, uint32 for N <= 32.
    """
    for bits, dtype in _WORD_DTYPES:
        if 1 <= num_cols <= bits:
            return dtype
    raise ValueError(f"QLEN_ONLY_BITPACKING supports 1..32 tree nodes, got {num_cols}")


def pack_rows_to_words(rows: Tensor) -> Tensor:
    """Pack each bool row into one unsigned word, column j -> bit j (SGLang order).

    Parameters
    ----------
    rows : Tensor
        ``[R, N]`` bool, ``1 <= N <= 32``.

    Returns
    -------
    Tensor
        ``[R]`` of :func:`sglang_word_dtype` ``(N)``; word r = ``sum_j rows[r, j] << j``.

    Examples
    --------
    >>> pack_rows_to_words(torch.tensor([[True, False, True], [False, True, True]]))
    tensor([5, 6], dtype=torch.uint8)
    """
    if rows.dtype != torch.bool or rows.dim() != 2:
        raise ValueError(f"rows must be a 2-D bool tensor, got {rows.dtype} {tuple(rows.shape)}")
    dtype = sglang_word_dtype(rows.shape[1])
    weights = torch.ones(rows.shape[1], dtype=torch.int64, device=rows.device) << torch.arange(
        rows.shape[1], device=rows.device
    )
    return (rows.to(torch.int64) * weights).sum(dim=1).to(dtype)


def unpack_words_to_rows(words: Tensor, num_cols: int) -> Tensor:
    """Inverse of :func:`pack_rows_to_words`.

    Parameters
    ----------
    words : Tensor
        ``[R]`` uint8 / uint16 / uint32.
    num_cols : int
        N, the number of columns to recover.

    Returns
    -------
    Tensor
        ``[R, N]`` bool.
    """
    shifts = torch.arange(num_cols, device=words.device)
    return ((words.to(torch.int64).unsqueeze(1) >> shifts) & 1).to(torch.bool)


def _check_indptr(indptr: Tensor, total: int, name: str) -> list[int]:
    if indptr.dim() != 1 or indptr.numel() < 1 or indptr.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be a 1-D int32/int64 tensor of shape [bs + 1]")
    bounds = [int(x) for x in indptr.tolist()]
    if bounds[0] != 0 or any(a > b for a, b in itertools.pairwise(bounds)) or bounds[-1] != total:
        raise ValueError(f"{name} must start at 0, be non-decreasing and end at {total}")
    return bounds


def segment_packbits(x: Tensor, indptr: Tensor) -> tuple[Tensor, Tensor]:
    """FlashInfer ``segment_packbits(x, indptr, bitorder="little")`` in pure torch.

    Parameters
    ----------
    x : Tensor
        ``[indptr[-1]]`` bool, the concatenated segments (e.g. the FULL_MASK layout,
        one segment per request).
    indptr : Tensor
        ``[bs + 1]`` int32/int64, segment b is ``x[indptr[b]:indptr[b + 1]]``.

    Returns
    -------
    packed : Tensor
        ``[new_indptr[-1]]`` uint8. Element k of segment b is bit ``k % 8`` of byte
        ``new_indptr[b] + k // 8``; trailing bits of a segment's last byte are 0.
    new_indptr : Tensor
        ``[bs + 1]`` int32 byte offsets, ``new_indptr[b+1] - new_indptr[b] ==
        (indptr[b+1] - indptr[b] + 7) // 8``.

    Examples
    --------
    >>> x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], dtype=torch.bool)
    >>> packed, new_indptr = segment_packbits(x, torch.tensor([0, 4, 7, 11]))
    >>> [bin(v) for v in packed.tolist()], new_indptr.tolist()
    (['0b1101', '0b100', '0b1011'], [0, 1, 2, 3])
    """
    if x.dtype != torch.bool or x.dim() != 1:
        raise ValueError(f"x must be a 1-D bool tensor, got {x.dtype} {tuple(x.shape)}")
    bounds = _check_indptr(indptr, x.numel(), "indptr")
    weights = torch.tensor([1 << k for k in range(8)], dtype=torch.uint8, device=x.device)
    pieces, byte_lens = [], []
    for start, end in itertools.pairwise(bounds):
        seg = x[start:end]
        nbytes = (seg.numel() + 7) // 8
        padded = torch.zeros(nbytes * 8, dtype=torch.uint8, device=x.device)
        padded[: seg.numel()] = seg.to(torch.uint8)
        pieces.append((padded.view(nbytes, 8) * weights).sum(dim=1, dtype=torch.uint8))
        byte_lens.append(nbytes)
    new_indptr = torch.zeros(len(bounds), dtype=torch.int32, device=x.device)
    if byte_lens:
        new_indptr[1:] = torch.cumsum(torch.tensor(byte_lens, dtype=torch.int32, device=x.device), 0)
    packed = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.uint8, device=x.device)
    return packed, new_indptr


def segment_unpackbits(packed: Tensor, new_indptr: Tensor, seg_lens: list[int]) -> Tensor:
    """Inverse of :func:`segment_packbits`.

    Parameters
    ----------
    packed : Tensor
        ``[new_indptr[-1]]`` uint8.
    new_indptr : Tensor
        ``[bs + 1]`` byte offsets.
    seg_lens : list of int
        ``bs`` original segment lengths in bits.

    Returns
    -------
    Tensor
        ``[sum(seg_lens)]`` bool.
    """
    bounds = _check_indptr(new_indptr, packed.numel(), "new_indptr")
    shifts = torch.arange(8, device=packed.device)
    out = []
    for b, n in enumerate(seg_lens):
        seg = packed[bounds[b] : bounds[b + 1]].to(torch.int64)
        bits = ((seg.unsqueeze(1) >> shifts) & 1).flatten().to(torch.bool)
        out.append(bits[:n])
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool, device=packed.device)
