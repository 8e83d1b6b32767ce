"""What a region of torch code would cost a GPU: host syncs and op launches, counted on any device.

A CUDA graph, and an overlap scheduler that runs the host one round ahead, both need a
decode round that never waits for the device. On a CPU every tensor is on the host, so
nothing blocks and nothing shows: `SyncDetector` names the operations that *would*
block on CUDA, wherever they run.

Flagged (each hit records the op and the caller's ``file:line``):

- scalar reads: ``.item()``, ``int(t)``, ``bool(t)``, ``if t.any():`` (``aten._local_scalar_dense``,
  ``aten.equal``, ``aten.is_nonzero``);
- outputs sized by data: ``nonzero``, ``masked_select``, ``unique``, ``bincount``, boolean-mask
  indexing ``x[mask]`` / ``x[mask] = v`` (an implicit ``nonzero``), ``repeat_interleave``
  with a tensor of repeats and no ``output_size``;
- host copies: ``.tolist()``, ``.cpu()``, ``.numpy()``, and ``torch.tensor(data)`` /
  ``torch.as_tensor(data)`` built from Python values inside the region (a host-to-device copy
  on CUDA; host values belong in the region's arguments).

`OpCounter` counts the aten ops a region dispatches (each is at least one kernel launch
on a GPU, and tens of microseconds of Python and dispatcher on a CPU).

>>> import torch
>>> x = torch.tensor([3, 0, 5])
>>> with SyncDetector() as sync:
...     n = int(x.max())           # a scalar read
...     y = x[x > 0]               # boolean-mask indexing
...     z = torch.where(x > 0, x, 0).cumsum(0)   # fine: fixed shape, no read
>>> [hit.op for hit in sync.hits]
['aten._local_scalar_dense.default', 'aten.index.Tensor']
>>> with OpCounter() as ops:
...     _ = (x + 1).sum()
>>> ops.total
2
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "SyncDetector", "SyncHit"]

_aten = torch.ops.aten

# ops whose output, or whose return value on the host, needs the device's data
_SYNC_OPS = {
    _aten._local_scalar_dense.default,
    _aten.equal.default,
    _aten.is_nonzero.default,
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
    _aten.bincount.default,
}
_INDEX_OPS = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}
_HOST_METHODS = {"tolist", "cpu", "numpy", "item"}
_FACTORIES = {torch.tensor, torch.as_tensor}

_HERE = str(Path(__file__).resolve())
_TORCH = str(Path(torch.__file__).resolve().parent)


@dataclass(frozen=True)
class SyncHit:
    """One operation that would block the host on a GPU."""

    op: str  # e.g. "aten._local_scalar_dense.default", "Tensor.tolist", "torch.tensor"
    where: str  # "file.py:123" of the innermost caller outside torch and this module

    def __str__(self) -> str:
        return f"{self.op} at {self.where}"


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()):
        name = str(Path(frame.filename).resolve()) if frame.filename[:1] not in "<" else frame.filename
        if name != _HERE and not name.startswith(_TORCH) and "/contextlib.py" not in name:
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return "?"


def _has_bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (indices or ()))


def _is_python_data(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return False
    if isinstance(data, (list, tuple)):
        return len(data) == 0 or all(_is_python_data(d) for d in data)
    return isinstance(data, (int, float, bool))


class _DispatchSyncs(TorchDispatchMode):
    def __init__(self, hits: list[SyncHit]) -> None:
        super().__init__()
        self.hits = hits

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        flagged = func in _SYNC_OPS
        flagged |= func in _INDEX_OPS and _has_bool_index(args)
        flagged |= func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None
        if func is _aten.repeat_interleave.self_Tensor and kwargs.get("output_size") is None:
            flagged = True
        if flagged:
            self.hits.append(SyncHit(str(func), _caller()))
        return func(*args, **kwargs)


class _FunctionSyncs(TorchFunctionMode):
    def __init__(self, hits: list[SyncHit]) -> None:
        super().__init__()
        self.hits = hits

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HOST_METHODS and args and isinstance(args[0], torch.Tensor) and name != "item":
            self.hits.append(SyncHit(f"Tensor.{name}", _caller()))
        elif func in _FACTORIES and args and _is_python_data(args[0]):
            self.hits.append(SyncHit(f"torch.{name}", _caller()))
        return func(*args, **kwargs)


class SyncDetector:
    """Context manager: record every operation in the region that would sync a GPU (module docstring).

    ``hits`` lists them in order; ``assert_none()`` raises with the list.
    """

    def __init__(self) -> None:
        self.hits: list[SyncHit] = []
        self._modes: tuple[TorchFunctionMode, TorchDispatchMode] | None = None

    def __enter__(self) -> SyncDetector:
        self._modes = (_FunctionSyncs(self.hits), _DispatchSyncs(self.hits))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._modes is not None
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = None

    def assert_none(self) -> None:
        if self.hits:
            lines = "\n  ".join(str(h) for h in self.hits)
            raise AssertionError(f"{len(self.hits)} host sync(s) in a region that must have none:\n  {lines}")


class OpCounter(TorchDispatchMode):
    """Context manager: count the aten ops dispatched in the region (``total``, ``by_op``)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        self.by_op[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())
