"""The SGLang plugin entry point: registers ``REANCHOR`` as a speculative algorithm.

pyproject.toml declares::

    [project.entry-points."sglang.srt.plugins"]
    reanchor = "sglang_reanchor.srt.plugin:register"

SGLang's ``load_plugins()`` runs every entry point of that group in each of its
processes (the launcher, the tokenizer manager, every scheduler), so after
``pip install sglang-reanchor`` the command line
``python -m sglang.launch_server --speculative-algorithm REANCHOR
--speculative-draft-model-path D --model-path T`` works with no edit to SGLang.

This module imports SGLang only inside `register`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register", "worker_factory"]


def worker_factory(server_args: Any) -> type:
    """SGLang asks this for the worker class (imported only when a server starts)."""
    del server_args
    from .worker import ReAnchorWorker

    return ReAnchorWorker


def register() -> None:
    """Register ``REANCHOR`` with ``SpeculativeAlgorithm.register``; a no-op if it already is."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from . import cpu_attention, seam
    from .cpu_compat import needs_cpu_hooks
    from .spec import NAME, ReAnchorSpecAlgo, validate_server_args

    if get_spec(NAME) is not None:
        return
    seam.check_version()  # an untested SGLang is refused here, by name
    seam.install("load", plain_cpu=needs_cpu_hooks())  # request checks; the plain-CPU RoPE hook (seam.HOOKS)
    cpu_attention.register()  # a new --attention-backend choice, reanchor_sdpa (custom masks on CPU)
    # The worker-time hooks are installed by ReAnchorWorker (REANCHOR processes only).
    SpeculativeAlgorithm.register(
        NAME,
        supports_overlap=False,
        validate_server_args=validate_server_args,
        spec_class=ReAnchorSpecAlgo,
    )(worker_factory)
