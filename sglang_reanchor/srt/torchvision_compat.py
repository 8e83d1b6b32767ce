"""Let the PyPI torchvision import on a CPU-only torch (SGLang imports it at startup).

SGLang 0.5.23 imports ``torchvision.transforms`` while loading its model configs
(``sglang.srt.configs`` -> ``multimodal.internvl_utils``), in every process. The
PyPI torchvision wheels are CUDA builds: their ``_C`` library does not load against
torch's CPU build, torchvision then skips its C ops, and its
``_meta_registrations`` fails on ``register_fake("torchvision::nms")`` with
``RuntimeError: operator torchvision::nms does not exist``.

This file installs an import hook that, just before
``torchvision._meta_registrations`` runs and only if torchvision's C ops did not
load, declares the schemas of the two ops it registers unconditionally (``nms``,
``qnms``). Everything else in torchvision (transforms on PIL images and tensors)
is the real code; calling ``torchvision.ops.nms`` still fails, as it would.

It is run (not imported, so the package and torch are not loaded at startup) by a
``.pth`` file that ``scripts/install_sglang.sh`` writes into the SGLang venv::

    import runpy; runpy.run_path("/path/to/sglang_reanchor/srt/torchvision_compat.py")
"""

import importlib.abc
import importlib.machinery
import sys

_TARGET = "torchvision._meta_registrations"
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARIES: list[object] = []  # keeps the torch.library.Library defining the schemas alive


class _DeclareMissingOps(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        extension = sys.modules.get("torchvision.extension")
        if extension is not None and not extension._has_ops():
            import torch

            lib = torch.library.Library("torchvision", "FRAGMENT")
            for schema in _SCHEMAS:
                try:
                    lib.define(schema)
                except RuntimeError:  # declared already (this file ran twice)
                    pass
            _LIBRARIES.append(lib)
        return None  # the normal finders load the module


if not any(type(f).__name__ == _DeclareMissingOps.__name__ for f in sys.meta_path):
    sys.meta_path.insert(0, _DeclareMissingOps())
